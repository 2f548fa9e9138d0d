"""The fusion seam without CKKS: the FusionView record, the torch-module channel, channels by name,
and FedSlate against every fusion channel name (one short episode, or a refusal at construction
that names why). The CKKS channel's own tests are in test_fusion.py (they need tenseal).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from securefed import ALL_PAYLOADS, RoundSelection, SecurefedError, ViewFormatError  # noqa: E402
from securefed.fusion import (  # noqa: E402
    FUSION_CHANNELS,
    FusionChannel,
    FusionNeeds,
    FusionNotApplicable,
    FusionSpec,
    ModuleFusionChannel,
    PlaintextFusionChannel,
    build_fusion_channel,
    fusion_refusal,
    init_weights,
)
from securefed.views import FusionView  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


# ----------------------------------------------------------------------------- the record
def _record_round(view: FusionView, round_id: int, tag: str = "act") -> None:
    view.open_round(round_id)
    x = np.full((2, 3), float(round_id), np.float32)
    payloads = {"a": {"input": x, "output": x[:, :1]}, "b": {"input": x}}
    view.record(
        "forward", network="online", tag=tag, train=False, outputs=["a"],
        bytes_up={"a": 24, "b": 24}, bytes_down={"a": 8},
        payloads=payloads if view.keeps_current else None,
    )  # fmt: skip
    view.record(
        "backward", network="online", tag="learn", train=True, outputs=["b"],
        bytes_up={"a": 8}, bytes_down={"b": 24},
        payloads={"a": {"output_grad": x[:, :1]}} if view.keeps_current else None,
        aggregate={"weight_grad": np.ones(2)} if view.keeps_current else None,
    )  # fmt: skip


def test_fusion_view_counts_every_exchange_and_keeps_the_selected_rounds(tmp_path):
    view = FusionView(
        "plaintext", ("a", "b"), keep_payloads=RoundSelection(rounds=frozenset({1}), last=1),
        total_rounds=5, public={"layout": "per_party"},
    )  # fmt: skip
    for r in range(5):
        _record_round(view, r)
    view.open_round(4)  # the open round continues
    ledger = view.ledger()
    np.testing.assert_array_equal(ledger["rounds"], np.arange(5))
    np.testing.assert_array_equal(ledger["bytes_up"], np.tile([32, 24], (5, 1)))
    np.testing.assert_array_equal(ledger["bytes_down"], np.tile([8, 24], (5, 1)))
    assert view.total_bytes() == (5 * 56, 5 * 32)
    assert view.bytes_per_party() == {"a": (160, 40), "b": (120, 120)}
    assert view.count(kind="forward") == 5 and view.count(tag="learn") == 5
    assert view.count(kind="forward", network="target") == 0 and view.steps == 10
    assert view.rounds_with_payloads() == [1, 4]
    (act,) = view.exchanges_of(tag="act", round_id=4)
    np.testing.assert_array_equal(act.payload("a")["input"], np.full((2, 3), 4.0))
    with pytest.raises(KeyError, match="no payload"):
        view.exchanges_of(kind="backward", round_id=4)[0].payload("b")
    loaded = FusionView.load(view.save(tmp_path / "view"))
    assert (loaded.channel, loaded.parties, loaded.public) == ("plaintext", ("a", "b"), view.public)
    assert loaded.counts == view.counts and loaded.steps == view.steps
    for name, array in view.ledger().items():
        np.testing.assert_array_equal(loaded.ledger()[name], array)
    assert [e.step for e in loaded.exchanges] == [e.step for e in view.exchanges] == [2, 3, 8, 9]
    np.testing.assert_array_equal(loaded.exchanges[-1].aggregate["weight_grad"], np.ones(2))
    with pytest.raises(ValueError, match="must increase"):
        view.open_round(2)
    with pytest.raises(ValueError, match="not parties"):
        view.record("forward", network="online", tag="", train=False, outputs=["c"],
                    bytes_up={}, bytes_down={})  # fmt: skip
    with pytest.raises(ValueError, match="kind"):
        view.record("sideways", network="online", tag="", train=False, outputs=[],
                    bytes_up={}, bytes_down={})  # fmt: skip
    with pytest.raises(ValueError, match="tag"):
        view.record("forward", network="online", tag="a/b", train=False, outputs=[],
                    bytes_up={}, bytes_down={})  # fmt: skip
    with pytest.raises(ValueError, match="distinct"):
        FusionView("plaintext", ("a", "a"))


def test_saved_fusion_views_that_do_not_follow_the_format_are_refused(tmp_path):
    view = FusionView("plaintext", ("a", "b"), keep_payloads=ALL_PAYLOADS)
    _record_round(view, 0)
    manifest, arrays = view.to_arrays()
    cases = {
        "format": (manifest | {"format": "securefed.server_view"}, arrays),
        "version": (manifest | {"version": 1}, arrays),  # before digests
        "missing": (manifest, {k: v for k, v in arrays.items() if "payload/a/input" not in k}),
        "counts disagree": (manifest | {"counts": {"forward/online/act": 5}}, arrays),
        "malformed": ({k: v for k, v in manifest.items() if k != "parties"}, arrays),
        "shape": (manifest, arrays | {"ledger/bytes_up": np.zeros((1, 3), np.int64)}),
    }
    for expected, (bad_manifest, bad_arrays) in cases.items():
        with pytest.raises(ViewFormatError, match=expected):
            FusionView.from_arrays(bad_manifest, bad_arrays, "somewhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ViewFormatError, match=r"manifest\.json is missing"):
        FusionView.load(tmp_path / "empty")
    saved = view.save(tmp_path / "view")
    (saved / "arrays.npz").write_bytes(b"not a zip file")
    with pytest.raises(ViewFormatError, match=r"arrays\.npz: digest mismatch"):
        FusionView.load(saved)  # saved fusion views are sealed like every record


# ----------------------------------------------------------------------------- the module channel
class TwoSlots(torch.nn.Module):
    """``y = w_0 x_own + w_1 x_other`` per member (a per-party server function)."""

    def __init__(self, members: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(1.0, 1.0 + 2 * members).reshape(members, 2))

    def forward(self, ordered, positions=None):
        own, other = ordered
        out = self.w[:, :1, None] * own + self.w[:, 1:, None] * other
        return out if positions is None else torch.gather(out, 2, positions)

    def numpy_forward(self, ordered):
        w = self.w.detach().numpy()
        return w[:, :1, None] * ordered[0] + w[:, 1:, None] * ordered[1]


def _module_channel(**options) -> ModuleFusionChannel:
    server, target = TwoSlots(2), TwoSlots(2)
    with torch.no_grad():
        target.w.zero_()
    optimiser = torch.optim.SGD(server.parameters(), lr=0.1)
    return ModuleFusionChannel(("a", "b"), server, optimiser, target=target, members=2, **options)


def test_module_channel_evaluates_trains_and_records_what_the_server_saw():
    channel = _module_channel(keep_payloads=ALL_PAYLOADS)
    assert isinstance(channel, FusionChannel) and channel.parties == ("a", "b")
    torch.testing.assert_close(channel.target.w, channel.module.w)  # the frozen copy
    rng = np.random.default_rng(0)
    xa, xb = rng.random((2, 3, 4), np.float32), rng.random((2, 3, 4), np.float32)
    channel.open_round(0)
    fast = channel.forward({"a": xa, "b": xb}, train=False, tag="act")  # numpy_forward
    slow = channel.forward({"a": torch.from_numpy(xa), "b": torch.from_numpy(xb)}, train=False)
    assert isinstance(fast["a"], np.ndarray) and isinstance(slow["a"], torch.Tensor)
    np.testing.assert_allclose(fast["b"], slow["b"].numpy(), rtol=1e-6)
    w = channel.module.w.detach().numpy()
    np.testing.assert_allclose(fast["b"], w[:, :1, None] * xb + w[:, 1:, None] * xa, rtol=1e-6)
    # Training: a asks for two positions; its input gradient comes back, the server steps.
    pos = torch.tensor([[[0, 3]] * 3, [[1, 1]] * 3])
    channel.open_round(1)
    qa = torch.from_numpy(xa).requires_grad_(True)
    fused = channel.forward({"a": qa, "b": torch.from_numpy(xb)}, outputs=["a"],
                            positions={"a": pos}, tag="learn")["a"]  # fmt: skip
    assert fused.shape == (2, 3, 2) and not fused.requires_grad
    before = channel.module.w.detach().clone()
    grads = channel.backward({"a": torch.ones_like(fused)}, recipients=["a"])
    assert set(grads) == {"a"}
    expected = torch.zeros(2, 3, 4)
    for m in range(2):
        for i in pos[m, 0].tolist():
            expected[m, :, i] += before[m, 0]
    torch.testing.assert_close(grads["a"], expected)
    assert not torch.equal(channel.module.w, before)  # the server's own SGD step
    torch.testing.assert_close(channel.target.w, before)  # the target stays frozen
    target_out = channel.forward({"a": xa, "b": xb}, network="target", train=False)
    w0 = before.numpy()
    np.testing.assert_allclose(target_out["a"], w0[:, :1, None] * xa + w0[:, 1:, None] * xb)
    channel.sync_target()
    torch.testing.assert_close(channel.target.w, channel.module.w)
    # The view: every vector the server received, what it sent, the positions, the bytes.
    view = channel.view
    assert view.count(tag="act") == 1 and view.count(tag="learn") == 2
    assert view.count(network="target") == 1 and view.public["layout"] == "per_party"
    learn_forward, learn_backward = view.exchanges_of(tag="learn")
    np.testing.assert_array_equal(learn_forward.payload("b")["input"], xb)
    np.testing.assert_array_equal(learn_forward.payload("a")["positions"], pos.numpy())
    assert learn_forward.bytes_up == {"a": xa.nbytes + pos.numpy().nbytes, "b": xb.nbytes}
    assert learn_forward.bytes_down == {"a": 2 * 3 * 2 * 4}
    np.testing.assert_array_equal(learn_backward.payload("a")["input_grad"], expected.numpy())
    assert learn_backward.outputs == ("a",) and learn_backward.bytes_down == {"a": xa.nbytes}


def test_module_channel_refuses_bad_input():
    channel = _module_channel()
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(RuntimeError, match="forward"):
        channel.backward({"a": torch.zeros(2, 3, 4)})
    with pytest.raises(ValueError, match="missing"):
        channel.forward({"a": x})
    with pytest.raises(ValueError, match=r"\(2, batch, width\)"):
        channel.forward({"a": x[:1], "b": x[:1]})
    with pytest.raises(ValueError, match="same users"):
        channel.forward({"a": x, "b": x[:, :2]})
    with pytest.raises(ValueError, match="NaN"):
        channel.forward({"a": np.full_like(x, np.nan), "b": x})
    with pytest.raises(ValueError, match="frozen"):
        channel.forward({"a": x, "b": x}, network="target", train=True)
    with pytest.raises(ValueError, match="outputs"):
        channel.forward({"a": x, "b": x}, outputs="a")
    with pytest.raises(ValueError, match="integer"):
        channel.forward({"a": x, "b": x}, positions={"a": x})
    with pytest.raises(ValueError, match="positions for parties"):
        channel.forward({"a": x, "b": x}, outputs=["a"], positions={"b": np.zeros((2, 3, 1), int)})
    with pytest.raises(ValueError, match="width 4"):
        channel.forward({"a": x, "b": x}, train=False, positions={"a": np.full((2, 3, 1), 4)})
    out = channel.forward({"a": x, "b": x}, outputs=["a"])["a"]
    with pytest.raises(ValueError, match="no forward output"):
        channel.backward({"b": torch.zeros_like(out)})
    with pytest.raises(ValueError, match="shape"):
        channel.backward({"a": torch.zeros(2, 3, 1)})
    with pytest.raises(ValueError, match="NaN"):
        channel.backward({"a": torch.full_like(out, np.inf)})
    server = TwoSlots(2)
    with pytest.raises(ValueError, match="separate module"):
        ModuleFusionChannel(("a", "b"), server, torch.optim.SGD(server.parameters(), lr=1.0),
                            target=server)  # fmt: skip
    with pytest.raises(RuntimeError, match="no target"):
        ModuleFusionChannel(("a", "b"), server, torch.optim.SGD(server.parameters(), lr=1.0),
                            members=2).sync_target()  # fmt: skip


def test_plaintext_spec_channel_grows_with_the_protocol():
    spec = FusionSpec.of({"a": 3, "b": 2}, {"a": 3, "b": 1}, hidden=(4,))
    weights = init_weights(spec, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    x = {"a": rng.normal(size=(5, 3)), "b": rng.normal(size=(5, 2))}
    selective = PlaintextFusionChannel(spec, weights, lr=0.1, keep_payloads=ALL_PAYLOADS)
    full = PlaintextFusionChannel(spec, weights, lr=0.1)
    pos = np.array([[0, 2]] * 3 + [[1, 1]] * 2)
    picked = selective.forward(x, outputs=["a"], positions={"a": pos}, tag="learn")
    everything = full.forward(x)
    np.testing.assert_allclose(picked["a"], np.take_along_axis(everything["a"], pos, axis=1))
    g = rng.normal(size=(5, 2))
    scattered = np.zeros((5, 3))
    np.add.at(scattered, (np.arange(5)[:, None], pos), g)
    dx = selective.backward({"a": g}, recipients=["b"])
    dx_full = full.backward({"a": scattered, "b": np.zeros((5, 1))})
    assert set(dx) == {"b"}
    np.testing.assert_allclose(dx["b"], dx_full["b"], atol=1e-12)
    assert selective.weights.max_abs_difference(full.weights) < 1e-12
    # The target network keeps the initial weights until synced.
    initial = PlaintextFusionChannel(spec, weights).forward(x, train=False)
    target = selective.forward(x, network="target", train=False)
    np.testing.assert_allclose(target["a"], initial["a"], atol=1e-12)
    selective.sync_target()
    online = selective.forward(x, train=False)
    np.testing.assert_allclose(selective.forward(x, network="target", train=False)["b"],
                               online["b"], atol=1e-12)  # fmt: skip
    view = selective.view
    assert view.public["layout"] == "concatenated" and view.count(tag="learn") == 2
    forward = view.exchanges_of(tag="learn", kind="forward")[0]
    assert forward.bytes_up == {"a": 5 * 3 * 8 + pos.nbytes, "b": 5 * 2 * 8}
    assert forward.bytes_down == {"a": 5 * 2 * 8}
    selective.forward(x, outputs=["a"])
    with pytest.raises(ValueError, match="received no output"):
        selective.backward({"b": np.zeros((5, 1))})


# ----------------------------------------------------------------------------- channels by name
PER_PARTY_ADAM = FusionNeeds(members=3, activation="relu", layout="per_party", optimiser="adam")


def test_channels_by_name_build_or_say_why_not():
    assert FUSION_CHANNELS == ("plaintext", "ckks", "dp", "ckks+dp", "secagg")
    assert fusion_refusal("plaintext", PER_PARTY_ADAM) is None
    ckks = fusion_refusal("ckks", PER_PARTY_ADAM)
    for reason in ("polynomial", "'relu'", "position by position"):
        assert reason in ckks
    assert "members" not in ckks and "'adam'" not in ckks  # served: members side by side, Adam
    served = FusionNeeds(members=1, activation="identity", layout="concatenated", optimiser="sgd")
    only = fusion_refusal("ckks", served)
    assert "concatenated" in only and "polynomial" not in only and "members" not in only
    by_position = FusionNeeds(3, "polynomial", optimiser="adam", elementwise=True)
    assert fusion_refusal("ckks", by_position) is None
    assert "not a sum" in fusion_refusal("secagg", PER_PARTY_ADAM)
    assert fusion_refusal("dp", PER_PARTY_ADAM) is None  # the DP wrapper of the plaintext one
    assert fusion_refusal("ckks+dp", PER_PARTY_ADAM).startswith("the ckks+dp fusion channel wraps")
    server = TwoSlots(2)
    adam = torch.optim.Adam(server.parameters())
    needs = FusionNeeds(members=2, activation="linear", optimiser="adam")
    channel = build_fusion_channel("plaintext", ("a", "b"), server, adam, needs)
    assert isinstance(channel, ModuleFusionChannel) and channel.view.public["optimiser"] == "adam"
    for name in ("ckks", "ckks+dp", "secagg"):
        with pytest.raises(FusionNotApplicable) as refused:
            build_fusion_channel(name, ("a", "b"), server, adam, needs)
        assert isinstance(refused.value, SecurefedError) and isinstance(refused.value, ValueError)
        assert str(refused.value) == fusion_refusal(name, needs)
    with pytest.raises(ValueError, match="unknown fusion channel"):
        build_fusion_channel("he", ("a", "b"), server, adam, needs)
    with pytest.raises(ValueError, match="'sgd' but the optimiser is 'adam'"):
        build_fusion_channel("plaintext", ("a", "b"), server, adam, FusionNeeds(members=2))
    with pytest.raises(ValueError, match="layout"):
        FusionNeeds(layout="stacked")


def test_importing_the_fusion_seam_imports_neither_torch_nor_tenseal():
    code = (
        "import sys, securefed, securefed.fusion, securefed.fusion.registry; "
        "print(sorted(m for m in ('torch', 'tenseal') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- FedSlate x channel
TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 12, "episodes": 1, "members": 2,
    "burn_in": 11, "learn_every": 12, "buffer_size": 16, "batch_size": 4, "local_hidden": (8,),
    "server_hidden": (4,), "seed": 0,  # seeded: the tests compare runs
}  # fmt: skip
REFUSAL = {"ckks": "cannot serve", "ckks+dp": "ckks\\+dp fusion channel", "secagg": "not a sum"}


@pytest.mark.parametrize("variant", ["fedslate", "linear"])
@pytest.mark.parametrize("name", FUSION_CHANNELS)
def test_fedslate_runs_one_episode_or_refuses_on_every_fusion_channel(name, variant, monkeypatch):
    pytest.importorskip("gymnasium")
    from securefed.rl.envs import ChocKaleBatch
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    dp = {"dp_epsilon": 8.0} if name in ("dp", "ckks+dp") else {}
    config = FedSlateConfig(**TINY, variant=variant, fusion=name, **dp)
    why = fusion_refusal(name, config.fusion_needs())
    steps = []
    real_step = ChocKaleBatch.step

    def counting_step(self, platform, slates):
        steps.append(platform)
        return real_step(self, platform, slates)

    monkeypatch.setattr(ChocKaleBatch, "step", counting_step)
    if why is None:
        result = run_fedslate(config)
        assert result.learn_steps == 1 and result.updates == {"local_A": 1, "local_B": 1,
                                                              "server": 2}  # fmt: skip
        view = result.fusion_view
        assert view.channel == name and len(view.ledger()["rounds"]) == 12
        assert view.count(tag="act") == 12 and view.count(kind="backward") == 2
        assert len(steps) == 24
        return
    with pytest.raises(FusionNotApplicable, match=REFUSAL[name]) as refused:
        run_fedslate(config)
    assert str(refused.value) == why and not steps  # refused before the first episode
    if name == "ckks":  # what the configuration asks that CKKS cannot give
        assert "'silu'" in why and variant == "fedslate"  # the linear server runs under CKKS
    if name == "ckks+dp":  # CKKS's own reason where it refuses, else the composition's
        assert ("'silu'" in why) == (variant == "fedslate") and "ckks+dp" in why


def test_the_cli_refuses_a_fusion_channel_in_one_line(capsys):
    pytest.importorskip("gymnasium")
    from securefed.bench.cli_fedslate import main

    assert main(["--candidates", "6", "--slate", "2", "--episodes", "1", "--fusion", "ckks"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("securefed: error: the ckks fusion channel cannot serve") and (
        "\n" not in err
    )
    with pytest.raises(SystemExit):
        main(["--fusion", "he"])


def test_a_loaded_fusion_view_keeps_recording(tmp_path):
    for rounds in (0, 3):
        view = FusionView("plaintext", ("a", "b"), keep_payloads=ALL_PAYLOADS)
        for r in range(rounds):
            _record_round(view, r)
        loaded = FusionView.load(view.save(tmp_path / f"view{rounds}"))
        for r in range(rounds, rounds + 70):  # beyond the loaded ledger's capacity
            _record_round(loaded, r)
        assert len(loaded.ledger()["rounds"]) == rounds + 70 and loaded.steps == 2 * (rounds + 70)
        assert loaded.rounds_with_payloads() == list(range(rounds + 70))
