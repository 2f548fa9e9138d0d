"""The ckks+dp fusion channel: each platform clips, noises and clamps its Q-values (the dp
channel's mechanism and ledger) before it encrypts them into FedSlate's CKKS channel."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tenseal")

from securefed import ALL_PAYLOADS, SeedTree  # noqa: E402
from securefed.crypto.ckks import Flooding, PublicContext  # noqa: E402
from securefed.errors import PrivacyBudgetExceeded  # noqa: E402
from securefed.fusion import (  # noqa: E402
    DPFusionChannel,
    DPFusionOptions,
    FusionNeeds,
    FusionNotApplicable,
    build_fusion_channel,
    fusion_refusal,
)
from securefed.fusion.ckks_module import CKKSModuleConfig, CKKSModuleFusionChannel  # noqa: E402
from securefed.fusion.dp import REPLACEMENT_SENSITIVITY, clamp_entries  # noqa: E402
from securefed.rl.fedslate import ServerNetwork  # noqa: E402

S, B, N = 1, 32, 10  # one member, FedSlate's learning batch at (10, 3)
PARTIES = ("A", "B")
NEEDS = FusionNeeds(members=S, activation="polynomial", optimiser="sgd", elementwise=True)
EXACT = CKKSModuleConfig(flooding=Flooding.unsafe_for_tests(0.0, 0.0))


def _options(**changes) -> DPFusionOptions:
    base = {"epsilon": 4.0, "releases_per_unit": 50, "clamp_sigmas": 4.0}
    return DPFusionOptions(**(base | changes))


def _noise(seed: int = 7) -> dict[str, np.random.Generator]:
    return {p: np.random.default_rng([seed, i]) for i, p in enumerate(PARTIES)}


def _server():
    return ServerNetwork(S, 2, N, (16, 16), activation="polynomial",
                         generator=torch.Generator().manual_seed(0))  # fmt: skip


def _channel(name: str, options: DPFusionOptions, config=EXACT):
    server = _server()
    return build_fusion_channel(
        name, PARTIES, server, torch.optim.SGD(server.parameters(), lr=0.1), NEEDS,
        target=copy.deepcopy(server), seeds=SeedTree(5), dp=options,
        ckks_config=config if name == "ckks+dp" else None,
        noise=_noise(), keep_payloads=ALL_PAYLOADS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pair(torch_one_thread):
    """The same server and noise behind ckks+dp and dp with the same clamp."""
    options = _options()
    return _channel("dp", options), _channel("ckks+dp", options)


def _q(seed: int, scale: float = 3.0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {
        p: torch.from_numpy(rng.normal(0, scale, (S, B, N)).astype(np.float32)) for p in PARTIES
    }


def test_ckks_dp_is_built_and_refused_without_a_clamp(torch_one_thread):
    assert fusion_refusal("ckks+dp", NEEDS) is None
    with pytest.raises(FusionNotApplicable, match="clamp_sigmas"):
        _channel("ckks+dp", _options(clamp_sigmas=None))
    channel = _channel("ckks+dp", _options())
    assert isinstance(channel, DPFusionChannel) and channel.name == "ckks+dp"
    assert isinstance(channel.inner, CKKSModuleFusionChannel)
    # The CKKS channel's public bounds are the clamp's: entries in [-1, 1], gradients in B_g.
    sigma = channel.noise_multiplier
    widening = 1 + 4.0 * REPLACEMENT_SENSITIVITY * sigma
    assert channel.bounds == pytest.approx({"input": 1.0 * widening, "grad": 1.0 * widening})
    assert channel.inner.config.value_bound == 1.0
    assert channel.inner.config.grad_bound == pytest.approx(channel.bounds["grad"])
    public = channel.view.public["dp"]
    assert public["clamp_bounds"] == channel.bounds and public["input_scale"] == 1 / widening


def test_the_run_over_budget_is_refused_before_anything_is_built(torch_one_thread, monkeypatch):
    built = []
    original = CKKSModuleFusionChannel.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(CKKSModuleFusionChannel, "__init__", counting)
    # The attack: a noise multiplier too small for the schedule would spend epsilon 4 many times.
    with pytest.raises(PrivacyBudgetExceeded):
        _channel("ckks+dp", _options(noise_multiplier=0.3, releases_per_unit=5000))
    assert not built  # no key generated, nothing encrypted, nothing released


def test_the_server_context_cannot_decrypt_a_noised_q_value_ciphertext(pair):
    _, channel = pair
    inner = channel.inner
    released = np.random.default_rng(1).uniform(-1, 1, S * B * N)
    [ciphertext] = inner.keys["A"].encrypt_for(released, inner.keys["A"])
    server = inner.server_contexts["A"]
    assert isinstance(server, PublicContext) and not server.tenseal.has_secret_key()
    ciphertext.link_context(server.tenseal)
    with pytest.raises(ValueError, match="secret_key"):
        ciphertext.decrypt()
    # The view records ciphertext sizes, never a Q-value.
    channel.open_round(0)
    channel.forward(_q(3), train=False, tag="act")
    exchange = channel.view.exchanges[-1]
    assert all("input" not in fields for fields in exchange.payloads.values())


def test_fused_values_equal_dp_fusion_of_the_clamped_values_within_the_ckks_error(
    torch_one_thread,
):
    # The same server weights and noise streams behind both (fresh: nothing drawn yet).
    plain, encrypted = _channel("dp", _options()), _channel("ckks+dp", _options())
    q = _q(2)
    clear = plain.forward(q, train=False)
    ours = encrypted.forward(q, train=False)
    bound = encrypted.inner.error_bounds()["output"]
    for p in PARTIES:
        gap = np.abs(ours[p].numpy() - clear[p].numpy()).max(axis=(1, 2))
        assert np.all(gap <= bound) and gap.max() < 1e-3
    # Both released the same clamped rows: the same clamp rates, reported per party.
    assert plain.clamp_rates() == encrypted.clamp_rates()
    assert set(encrypted.clamp_rates()) == set(PARTIES)


def test_a_training_step_matches_the_dp_channel_within_the_ckks_error(torch_one_thread):
    plain, encrypted = _channel("dp", _options()), _channel("ckks+dp", _options())
    q, rng = _q(4), np.random.default_rng(5)
    grads = {
        p: torch.from_numpy(rng.uniform(-0.02, 0.02, (S, B, N)).astype(np.float32)) for p in PARTIES
    }
    for channel in (plain, encrypted):
        channel.forward(q, train=True, tag="learn")
    clear, ours = plain.backward(grads), encrypted.backward(grads)
    bound = encrypted.inner.error_bounds()["input_gradient"] / encrypted.bounds["input"]
    for p in PARTIES:
        gap = np.abs(ours[p].numpy() - clear[p].numpy()).max()
        assert gap <= bound.max()
    for a, b in zip(plain.module.parameters(), encrypted.module.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_every_released_entry_lies_within_the_public_bound_and_the_clamp_is_counted():
    values = np.array([[-5.0, 0.5, 2.0, 7.0]])
    clamped, count = clamp_entries(values, 2.0)
    np.testing.assert_array_equal(clamped, [[-2.0, 0.5, 2.0, 2.0]])
    assert count == 2
    # A huge Q-value leaves the platform clipped, noised, clamped and scaled into [-1, 1].
    plain = _channel("dp", _options(clamp_sigmas=0.01))
    plain.open_round(0)
    huge = {p: torch.full((S, B, N), 1e6, dtype=torch.float32) for p in PARTIES}
    plain.forward(huge, train=False, tag="act")
    released = plain.view.exchanges[-1].payloads["A"]["input"]
    assert np.abs(released).max() <= 1.0 + 1e-12
    rate = plain.clamp_rates()["A"]["input"]
    assert 0.5 < rate < 1.0  # 0.01 sigmas: most noised entries fall outside the bound


def test_an_unbounded_value_is_refused_by_the_ckks_channel_not_wrapped(pair):
    _, channel = pair
    inner = channel.inner
    above = {p: torch.full((S, B, N), 1.5, dtype=torch.float32) for p in PARTIES}
    with pytest.raises(ValueError, match="above the channel's public bound 1"):
        inner.forward(above, train=False)
    inner.forward(_q(6, scale=0.1), train=True)
    too_steep = {p: torch.full((S, B, N), 2 * channel.bounds["grad"]) for p in PARTIES}
    with pytest.raises(ValueError, match="output gradient reaches"):
        inner.backward(too_steep)
