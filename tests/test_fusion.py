"""Tests of the fusion shape: the plaintext (torch) channel, the folded schedule, CKKS agreement.

The seam's parts that need no tenseal (FusionView, the torch-module channel, channels by name,
FedSlate against every channel) are in test_fusion_matrix.py.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto.ckks import fusion_levels
from securefed.fusion import (
    RELU_FIT,
    FusionChannel,
    FusionSpec,
    FusionWeights,
    Party,
    PlaintextFusionChannel,
    forward_numpy,
    init_weights,
    polynomial,
)
from securefed.fusion.base import concatenate

ts = pytest.importorskip("tenseal")

from securefed.crypto.ckks import CKKSParameters, SecretContext, ckks_context  # noqa: E402
from securefed.fusion.ckks import (  # noqa: E402
    CKKSFusionChannel,
    CKKSFusionConfig,
    NumpyOps,
    fused_backward,
    fused_forward,
    schedule_levels,
)

SPEC = FusionSpec.of({"a": 3, "b": 2}, {"a": 2, "b": 1}, hidden=(4,))


def _data(spec: FusionSpec, n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = {p.name: rng.normal(size=(n, p.input_dim)) for p in spec.parties}
    g = {p.name: rng.normal(size=(n, p.output_dim)) / n for p in spec.parties}
    return x, g


# ----------------------------------------------------------------------------- specs and weights
def test_spec_validation():
    assert SPEC.input_dim == 5 and SPEC.output_dim == 3 and SPEC.layer_sizes == (5, 4, 3)
    assert SPEC.depth == 2 and SPEC.degree == 2 and SPEC.activation == RELU_FIT
    assert SPEC.output_slices() == {"a": slice(0, 2), "b": slice(2, 3)}
    with pytest.raises(ValueError, match="distinct"):
        FusionSpec((Party("a", 1, 1), Party("a", 2, 1)))
    with pytest.raises(ValueError, match="input_dim"):
        Party("a", 0, 1)
    with pytest.raises(ValueError, match="c_d"):
        FusionSpec((Party("a", 1, 1),), activation=(0.1, 0.0))
    with pytest.raises(ValueError, match="same parties"):
        FusionSpec.of({"a": 1}, {"b": 1})
    with pytest.raises(ValueError, match="hidden"):
        FusionSpec((Party("a", 1, 1),), hidden=(0,))


def test_weights_are_checked_against_the_spec():
    weights = init_weights(SPEC, np.random.default_rng(0))
    assert [w.shape for w, _ in weights.layers] == [(5, 4), (4, 3)]
    with pytest.raises(ValueError, match="layers"):
        FusionWeights(weights.layers[:1]).check(SPEC)
    bad = weights.copy()
    bad.layers[1] = (np.ones((4, 2)), np.ones(2))
    with pytest.raises(ValueError, match=r"\(4, 3\)"):
        bad.check(SPEC)
    bad.layers[1] = (np.full((4, 3), np.inf), np.ones(3))
    with pytest.raises(ValueError, match="inf"):
        bad.check(SPEC)
    np.testing.assert_allclose(polynomial((1.0, 2.0, 3.0), np.array([2.0])), [17.0])


# ----------------------------------------------------------------------------- plaintext channel
def test_plaintext_channel_forward_backward_and_errors():
    weights = init_weights(SPEC, np.random.default_rng(1))
    channel = PlaintextFusionChannel(SPEC, weights, lr=0.1)
    assert isinstance(channel, FusionChannel)
    x, g = _data(SPEC, 6, 2)
    y = channel.forward(x)
    assert {k: v.shape for k, v in y.items()} == {"a": (6, 2), "b": (6, 1)}
    reference = forward_numpy(SPEC, weights, concatenate(SPEC, x))
    np.testing.assert_allclose(np.hstack([y["a"], y["b"]]), reference, atol=1e-12)
    dx = channel.backward(g)
    assert {k: v.shape for k, v in dx.items()} == {"a": (6, 3), "b": (6, 2)}
    assert channel.weights.max_abs_difference(weights) > 0  # the server stepped
    with pytest.raises(RuntimeError, match="forward"):
        channel.backward(g)
    with pytest.raises(ValueError, match="each party"):
        channel.forward({"a": x["a"]})
    with pytest.raises(ValueError, match="width"):
        channel.forward({"a": x["a"], "b": x["a"]})
    with pytest.raises(ValueError, match="rows"):
        channel.forward({"a": x["a"], "b": x["b"][:3]})
    torch = pytest.importorskip("torch")
    y_tensor = channel.forward({k: torch.tensor(v) for k, v in x.items()})
    assert isinstance(y_tensor["a"], np.ndarray)


# ----------------------------------------------------------------------------- the schedule
@pytest.mark.parametrize(
    ("hidden", "activation"),
    [((), RELU_FIT), ((4,), RELU_FIT), ((4, 3), (0.1, 0.5, 0.2, 0.05)), ((3,), (0.0, 0.0, 1.0))],
)
def test_folded_schedule_matches_torch_autograd(hidden, activation):
    spec = FusionSpec.of({"a": 3, "b": 2}, {"a": 2, "b": 1}, hidden=hidden, activation=activation)
    weights = init_weights(spec, np.random.default_rng(3))
    x, g = _data(spec, 7, 4)
    lr = 1.0
    plain = PlaintextFusionChannel(spec, weights, lr=lr)
    y_plain = plain.forward(x)
    dx_plain = plain.backward(g)
    ops = NumpyOps(7)
    y, cache = fused_forward(ops, spec, weights, list(concatenate(spec, x).T))
    grads, dx = fused_backward(ops, spec, weights, cache, list(concatenate(spec, g).T))
    np.testing.assert_allclose(np.stack(y, 1), concatenate(spec, y_plain), atol=1e-12)
    np.testing.assert_allclose(np.stack(dx, 1), concatenate(spec, dx_plain), atol=1e-12)
    for (w, b), (gw, gb), (pw, pb) in zip(weights.layers, grads, plain.weights.layers, strict=True):
        np.testing.assert_allclose(w - lr * gw, pw, atol=1e-12)
        np.testing.assert_allclose(b - lr * gb, pb, atol=1e-12)


@pytest.mark.parametrize("hidden", [(), (3,), (3, 2), (2, 3, 2)])
@pytest.mark.parametrize(
    "activation", [(0.1, 1.0), RELU_FIT, (0.1, 0.2, 0.3, 0.4), (0, 0, 0, 0, 1)]
)
def test_level_formula_matches_a_dry_run_of_the_schedule(hidden, activation):
    spec = FusionSpec.of({"a": 2, "b": 1}, {"a": 1, "b": 2}, hidden=hidden, activation=activation)
    for training in (True, False):
        levels, counts = schedule_levels(spec, training=training)
        assert levels == fusion_levels(spec.depth, spec.degree, training=training)
        assert counts["plain_mul"] > 0


# ----------------------------------------------------------------------------- CKKS channel
@pytest.fixture(scope="module")
def fusion_keys() -> SecretContext:
    return ckks_context(SPEC.circuit(), encryption="public-key")


def test_ckks_channel_agrees_with_plaintext(fusion_keys):
    weights = init_weights(SPEC, np.random.default_rng(5))
    lr = 0.05
    plain = PlaintextFusionChannel(SPEC, weights, lr=lr)
    config = CKKSFusionConfig(lr=lr, key_holder="b")
    channel = CKKSFusionChannel(SPEC, weights, seeds=SeedTree(0), config=config, secret=fusion_keys)
    for step in range(2):
        x, g = _data(SPEC, 6, 10 + step)
        y_plain, y_ckks = plain.forward(x), channel.forward(x)
        for name in SPEC.names:
            assert np.max(np.abs(y_plain[name] - y_ckks[name])) < 1e-3
        dx_plain, dx_ckks = plain.backward(g), channel.backward(g)
        for name in SPEC.names:
            assert np.max(np.abs(dx_plain[name] - dx_ckks[name])) < 1e-3
        assert plain.weights.max_abs_difference(channel.weights) < 1e-4
    transcript = channel.transcript
    assert transcript.exchanges == 2 * (3 * 5 + 4 * 6)  # sum over layers of n_out (n_in + 1)
    assert transcript.bytes_to_party["b"] > transcript.bytes_to_party["a"]  # b is the key holder
    assert transcript.bytes_to_server["a"] > 0


def test_server_holds_only_the_public_context_and_the_key_holder_sees_masked_values(fusion_keys):
    weights = init_weights(SPEC, np.random.default_rng(6))
    channel = CKKSFusionChannel(SPEC, weights, seeds=SeedTree(1), secret=fusion_keys)
    server = channel.server
    assert not server.context.tenseal.has_secret_key()
    seen = []
    holder = channel.parties_by_name[channel.key_holder]
    original = holder.release_sum

    def spy(masked, n_rows, flooding, noise):
        seen.append(fusion_keys.decrypt(masked)[:n_rows])
        return original(masked, n_rows, flooding, noise)

    holder.release_sum = spy
    x, g = _data(SPEC, 5, 7)
    channel.forward(x)
    channel.backward(g)
    values = np.concatenate(seen)
    # Gradient terms are O(1); what the key holder decrypts carries masks of magnitude 2^16.
    assert np.median(np.abs(values)) > 1000
    assert server.masks.bound == 2.0**16


def test_ckks_channel_splits_large_batches_into_chunks():
    spec = FusionSpec.of({"a": 2, "b": 1}, {"a": 1, "b": 1}, hidden=())  # linear: one level
    small = SecretContext(CKKSParameters(4096, (36, 24, 36), 24, "public-key"))
    weights = init_weights(spec, np.random.default_rng(8))
    config = CKKSFusionConfig(lr=0.01, output_noise_std=0.0)
    channel = CKKSFusionChannel(spec, weights, seeds=SeedTree(2), config=config, secret=small)
    plain = PlaintextFusionChannel(spec, weights, lr=0.01)
    x, g = _data(spec, 2050, 9)  # 2048 slots: two chunks
    for name, value in channel.forward(x).items():
        assert np.max(np.abs(value - plain.forward(x)[name])) < 1e-2
    dx, dx_plain = channel.backward(g), plain.backward(g)
    assert dx["a"].shape == (2050, 2)
    assert np.max(np.abs(dx["a"] - dx_plain["a"])) < 1e-2
    assert channel.weights.max_abs_difference(plain.weights) < 1e-3


def test_ckks_channel_errors(fusion_keys):
    weights = init_weights(SPEC, np.random.default_rng(9))
    with pytest.raises(ValueError, match="key_holder"):
        CKKSFusionChannel(
            SPEC,
            weights,
            seeds=SeedTree(0),
            config=CKKSFusionConfig(key_holder="c"),
            secret=fusion_keys,
        )
    shallow = ckks_context(FusionSpec.of({"a": 1}, {"a": 1}, hidden=()).circuit())
    with pytest.raises(ValueError, match="level"):
        CKKSFusionChannel(SPEC, weights, seeds=SeedTree(0), secret=shallow)
    channel = CKKSFusionChannel(SPEC, weights, seeds=SeedTree(0), secret=fusion_keys)
    x, g = _data(SPEC, 4, 0)
    with pytest.raises(RuntimeError, match="forward"):
        channel.backward(g)
    with pytest.raises(ValueError, match="width"):
        channel.forward({"a": x["b"], "b": x["b"]})
    channel.forward(x)
    with pytest.raises(ValueError, match="rows"):
        channel.backward({"a": g["a"][:2], "b": g["b"][:2]})
    with pytest.raises(ValueError, match="lr"):
        CKKSFusionConfig(lr=0.0)
    symmetric = ckks_context(SPEC.circuit(), encryption="symmetric")
    with pytest.raises(ValueError, match="public-key"):
        CKKSFusionChannel(SPEC, weights, seeds=SeedTree(0), secret=symmetric)


def test_ckks_channel_in_secure_mode(fusion_keys):
    weights = init_weights(SPEC, np.random.default_rng(10))
    channel = CKKSFusionChannel(SPEC, weights, seeds=SeedTree.secure_mode(), secret=fusion_keys)
    x, _ = _data(SPEC, 3, 1)
    y = channel.forward(x)
    reference = forward_numpy(SPEC, weights, concatenate(SPEC, x))
    assert np.max(np.abs(concatenate(SPEC, y) - reference)) < 1e-3


def test_ckks_channel_view_holds_ciphertexts_and_the_weight_gradients_it_obtains(fusion_keys):
    weights = init_weights(SPEC, np.random.default_rng(11))
    lr = 0.05
    plain = PlaintextFusionChannel(SPEC, weights, lr=lr)
    channel = CKKSFusionChannel(
        SPEC, weights, seeds=SeedTree(3), config=CKKSFusionConfig(lr=lr), secret=fusion_keys,
        keep_payloads=ALL_PAYLOADS,
    )  # fmt: skip
    assert isinstance(channel, FusionChannel) and channel.parties == ("a", "b")
    x, g = _data(SPEC, 6, 12)
    pos = np.ones((6, 1), np.int64)
    channel.open_round(0)
    y = channel.forward(x, outputs=["a"], positions={"a": pos}, tag="learn")
    y_plain = plain.forward(x, outputs=["a"], positions={"a": pos})
    assert set(y) == {"a"} and np.max(np.abs(y["a"] - y_plain["a"])) < 1e-3
    dx = channel.backward({"a": g["a"][:, 1:]}, recipients=["b"])
    dx_plain = plain.backward({"a": g["a"][:, 1:]}, recipients=["b"])
    assert set(dx) == {"b"} and np.max(np.abs(dx["b"] - dx_plain["b"])) < 1e-3
    forward, backward = channel.view.exchanges_of(tag="learn")
    # What the server holds: ciphertext sizes and digests, never a value or the positions.
    assert sorted(forward.payload("a")) == [
        "input_ciphertext_sha256", "input_ciphertext_sizes",
        "output_ciphertext_sha256", "output_ciphertext_sizes",
    ]  # fmt: skip
    assert sorted(forward.payload("b")) == ["input_ciphertext_sha256", "input_ciphertext_sizes"]
    sizes = forward.payload("a")["input_ciphertext_sizes"]
    assert sizes.shape == (3,) and forward.bytes_up["a"] == sizes.sum()
    assert "b" not in forward.bytes_down
    assert forward.payload("a")["output_ciphertext_sha256"].shape == (2, 32)
    assert backward.bytes_down["a"] > 0  # the key holder's share of the masked exchange
    assert sorted(backward.payload("b")) == [
        "input_grad_ciphertext_sha256", "input_grad_ciphertext_sizes",
        "output_grad_ciphertext_sha256", "output_grad_ciphertext_sizes",
    ]  # fmt: skip
    # In the clear the server obtains the batch's weight gradients, and records them.
    for index, ((w0, b0), (w1, b1)) in enumerate(
        zip(weights.layers, plain.weights.layers, strict=True)
    ):
        np.testing.assert_allclose(backward.aggregate[f"layer{index}_weight_grad"], (w0 - w1) / lr,
                                   atol=5e-3)  # fmt: skip
        np.testing.assert_allclose(backward.aggregate[f"layer{index}_bias_grad"], (b0 - b1) / lr,
                                   atol=5e-3)  # fmt: skip
    # The target network keeps the initial weights until synced.
    target = channel.forward(x, network="target", train=False)
    reference = forward_numpy(SPEC, weights, concatenate(SPEC, x))
    assert np.max(np.abs(concatenate(SPEC, target) - reference)) < 1e-3
    channel.sync_target()
    synced = channel.forward(x, network="target", train=False)
    online = plain.forward(x, train=False)
    assert np.max(np.abs(concatenate(SPEC, synced) - concatenate(SPEC, online))) < 1e-3
    assert channel.view.count(network="target") == 2 and channel.view.public["key_holder"] == "a"
