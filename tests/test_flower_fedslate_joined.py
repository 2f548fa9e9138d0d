"""FedSlate on Flower under ``fusion="ckks"`` (packed circuit): the repeated and joined forwards
of the in-process channel carried over the messages (issue 33).

The server decides from what it holds (public shapes, the online weights' version) and says so
in the request: ``join`` (A's Algorithm-1 rows travel with the targets' ``target_values``
request, in regions 0-2 of the target forward's ciphertext; A's loss comes back with its
targets) and ``repeat`` (a training forward served from an earlier forward's ciphertexts: B's
learn forward repeats its select forward, its loss in the greedy reply). Each platform checks
on its node and refuses by name: a repeat of vectors it did not send, after the server's
weights changed, a join beyond ``4 n <= N / 2``, a second decryption and release of one
forward's values, and under ``ckks+dp`` any repeat or join (no second noisy row).

Attacks first (each fails on main, whose platforms ignore ``repeat`` and ``join`` and release a
second gradient of one forward), then the equality with the in-process packed run, its view
kind by kind, and the message rounds a learning step before and after."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tenseal")
pytest.importorskip("gymnasium")
pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_flower_fedslate_packed import DP, SMALL, _assert_equal_within_ckks  # noqa: E402

from securefed import SeedTree  # noqa: E402
from securefed.crypto.ckks import InsecureParameterError  # noqa: E402
from securefed.rl import flower_fedslate as ffs  # noqa: E402
from securefed.rl.fedslate import FedSlateConfig, run_fedslate  # noqa: E402
from securefed.rl.flower_fedslate import (  # noqa: E402
    FedSlateFlowerRun,
    drive_in_process,
    in_process_exchange,
    node_results,
    run_server,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LEARNING = ("target_values", "targets", "learn_rows", "greedy", "loss", "local_step")
"""The message rounds of a learning step (the server's own count, ``outcome.messages``)."""


def _tampered(run, change, stores=None):
    """An honest relay whose requests ``change(op, role, arrays, config)`` may rewrite (it
    returns the new ``(arrays, config)``, or ``None`` to leave the request as it is)."""
    stores = {} if stores is None else stores
    honest = in_process_exchange(run, stores, {})

    def exchange(op, requests):
        out = {}
        for role, (arrays, config) in requests.items():
            changed = change(op, role, dict(arrays), dict(config))
            out[role] = (arrays, config) if changed is None else changed
        return honest(op, out)

    return exchange


def _refused(run, change, error, match, stores=None):
    with pytest.raises(error, match=match):
        run_server(run, _tampered(run, change, stores))


# ----------------------------------------------------------------------------- attacks
def test_a_platform_refuses_a_repeat_of_vectors_it_did_not_send(torch_one_thread):
    """Attack: the server asks B's Algorithm-2 exchange to repeat the forward before its select
    forward (A's targets' forward, whose rows B sent for A, not B's training rows): the
    platforms would send no training rows and B would read stale values. Refused by name."""
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))

    def change(op, role, arrays, config):
        if op == "learn_rows" and config["updating"] == 1:
            return arrays, config | {"repeat": int(config.get("forward", 1)) - 1}
        return None

    _refused(run, change, ValueError, "refusing a repeat of vectors it did not send")


def test_a_platform_refuses_a_repeat_after_the_weights_changed(torch_one_thread):
    """Attack: the server says A's training forward repeats the joined forward while stating
    another version of its weights (it stepped them since): refused by name."""
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))

    def change(op, role, arrays, config):
        if op == "targets":
            return arrays, config | {"repeat": int(config.get("repeat", 0)), "version": 7}
        return None

    _refused(run, change, ValueError, "refusing a repeat after the weights changed")


def test_a_platform_refuses_a_join_into_a_forward_for_another_output(torch_one_thread):
    """Attack: the server asks the platforms to join A's training rows into a targets'
    forward whose output is also B's (B would decrypt A's training forward's fused values)."""
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))

    def change(op, role, arrays, config):
        if op == "target_values":
            return arrays, config | {"join": 0, "outputs": "0,1"}
        return None

    _refused(run, change, ValueError, r"join platform 0's training forward into a forward")


def test_a_platform_refuses_a_join_beyond_a_quarter_of_the_ring(keyed_platform):
    """A join of ``n`` entries needs ``4 n`` slots of the ``N / 2``: the platform computes it
    from the public shape and its own parameters."""
    platform = keyed_platform
    slots = platform.params.slots
    platform.check_join([0], 0, (2, slots // 8, 1))  # 4 n = N / 2: fits
    with pytest.raises(ValueError, match=r"4 n <= N / 2\): refusing"):
        platform.check_join([0], 0, (2, slots // 8 + 1, 1))


def test_check_repeat_names_each_cause(keyed_platform):
    """The three causes on a recorded forward: another forward's id, other vectors, the
    weights changed (the stated version, or a training exchange or step seen since)."""
    platform = keyed_platform
    rows = np.full((2, 2, 4), 0.25)
    platform.record([1], rows, {"forward": 5, "version": 2})
    asked = {"repeat": 5, "version": 2}
    assert platform.check_repeat(1, asked, rows)["id"] == 5
    with pytest.raises(ValueError, match="did not send"):
        platform.check_repeat(1, asked | {"repeat": 4}, rows)
    with pytest.raises(ValueError, match=r"differ from those it sent.*did not send"):
        platform.check_repeat(1, asked, rows + 1e-6)
    with pytest.raises(ValueError, match="after the weights changed"):
        platform.check_repeat(1, asked | {"version": 3}, rows)
    platform.exchanges += 1
    with pytest.raises(ValueError, match=r"1 training exchange.*after the weights changed"):
        platform.check_repeat(1, asked, rows)


def test_a_repeated_forwards_values_are_released_once(torch_one_thread):
    """Attack: after B's greedy reply carried its gradient of the repeated forward, the server
    asks B for a loss again (a second decryption and release of that forward's values)."""
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))
    honest = in_process_exchange(run, {}, {})
    served = {}

    def exchange(op, requests):
        replies = honest(op, requests)
        if op == "greedy":
            served.update(requests)
            arrays, config = requests[2]
            again = {k: v for k, v in arrays.items() if k.startswith("fused.")}
            honest("loss", {2: (again, {"op": "loss", "ckks.key": config["ckks.key"]})})
        return replies

    with pytest.raises(ValueError, match="already released its output gradient"):
        run_server(run, exchange)
    assert "repeat" in served[2][1]


def test_under_ckks_dp_a_second_release_of_one_forward_is_refused(torch_one_thread):
    """Attack under ckks+dp: the server asks A for its loss twice on one training forward
    (each loss a noisy gradient row: two of one forward average the noise down). The second
    is refused before anything is decrypted or released; A's ledger counts one release."""
    config = FedSlateConfig(**(SMALL | DP))
    run = FedSlateFlowerRun(config)
    stores = {}
    honest = in_process_exchange(run, stores, {})
    released = {}

    def exchange(op, requests):
        replies = honest(op, requests)
        if op == "loss":
            released.update(stores[1]["meta"]["node"]["released"])
            honest(op, requests)
        return replies

    with pytest.raises(ValueError, match=r"under ckks\+dp a second noisy row\): refusing"):
        run_server(run, exchange)
    assert stores[1]["meta"]["node"]["released"] == released
    assert released["learn:grad"] == config.members * config.batch_size


@pytest.mark.parametrize("op", ["learn_rows", "target_values"])
def test_under_ckks_dp_a_repeat_or_join_is_refused_before_any_release(op, torch_one_thread):
    """Attack under ckks+dp: the server asks a repeat (B's training forward served from its
    select forward) or a join; refused by name before any row is released: the nodes' ledgers
    and noise streams are untouched by the refused request."""
    run = FedSlateFlowerRun(FedSlateConfig(**(SMALL | DP)))
    stores = {}
    before = {}

    def change(o, role, arrays, config):
        if o != op:
            return None
        before[role] = (dict(stores[role]["meta"]["node"]["released"]),
                        dict(stores[role]["meta"]["node"]["rngs"]))  # fmt: skip
        extra = {"repeat": int(config.get("forward", 0))} if op == "learn_rows" else {"join": 0}
        return arrays, config | extra

    _refused(run, change, InsecureParameterError, r"under ckks\+dp every forward's rows", stores)
    for role, (released, rngs) in before.items():
        assert stores[role]["meta"]["node"]["released"] == released
        assert stores[role]["meta"]["node"]["rngs"] == rngs


def test_the_server_half_repeats_only_what_it_holds(torch_one_thread):
    """The ServerApp's own rule (``serve_repeat``, ``serve_forward(joined=True)``): a repeat
    needs a forward of the online network of the same shape for that owner and the same
    weights' version; a join one output, no training."""
    from securefed.crypto.ckks import ckks_context
    from securefed.fusion.ckks_packed import PackedCKKSModuleFusionChannel, PackedKeyParty
    from securefed.rl.fedslate import server_network

    config = FedSlateConfig(**SMALL)
    channel_config, _, kwargs, _ = ffs._ckks_setup(config)
    parties = {n: PackedKeyParty(n, ckks_context(**kwargs)) for n in "AB"}
    net = server_network(config, torch.Generator().manual_seed(0))
    channel = PackedCKKSModuleFusionChannel(
        ("A", "B"), net, torch.optim.Adam(net.parameters()), target=server_network(config),
        members=2, seeds=SeedTree(0), config=channel_config,
        public_contexts={n: party.public_bytes() for n, party in parties.items()},
    )  # fmt: skip
    shape = (2, 2, 4)
    x = np.full(int(np.prod(shape)), 0.5)
    own = parties["A"].encrypt_owner_regions(x).serialize()
    other = parties["B"].encrypt_other_regions(x, parties["A"].public).serialize()
    sent = {"A": {"A": [own], "B": [other]}}
    with pytest.raises(RuntimeError, match="no forward of the online network"):
        channel.serve_repeat("A", shape=shape, tag="learn")
    channel.serve_forward(sent, shape=shape, outputs=["A"], network="target", tag="target")
    with pytest.raises(RuntimeError, match="no forward of the online network"):
        channel.serve_repeat("A", shape=shape, tag="learn")
    with pytest.raises(ValueError, match="one forward without training for one output"):
        channel.serve_forward(sent, shape=shape, outputs=["A"], train=True, joined=True)
    channel.serve_forward(sent, shape=shape, outputs=["A"], tag="select")
    with pytest.raises(RuntimeError, match="no forward of the online network of shape"):
        channel.serve_repeat("A", shape=(2, 1, 8), tag="learn")
    with torch.no_grad():
        next(net.parameters()).add_(1e-3)  # the weights step
    with pytest.raises(RuntimeError, match="online weights changed"):
        channel.serve_repeat("A", shape=shape, tag="learn")


@pytest.fixture
def keyed_platform(torch_one_thread):
    """Platform A's CKKS half (its key made on the node) with B's public context."""
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))
    arrays, meta = {}, {}
    return ffs.CKKSPlatform(run.config, 0, SeedTree(0), arrays, meta)


# ----------------------------------------------------------------------------- equality
def _learning_rounds(outcome) -> int:
    return sum(outcome.messages.get(op, 0) for op in LEARNING)


def test_repeated_and_joined_forwards_decide_as_the_in_process_run(tmp_path, monkeypatch):
    """The seeded run through the message flow with the joined targets' forward and both
    repeats (about 6 s of CPU each way): the same rewards, the weights within the CKKS error,
    the server's view equal to the in-process channel's kind by kind (its exchanges by kind,
    network and tag; per round the forwards, backwards and ciphertexts up and down by party),
    and 6 message rounds a learning step where the unjoined flow takes 9."""
    config = FedSlateConfig(**SMALL)
    reference = run_fedslate(config)
    outcome = drive_in_process(FedSlateFlowerRun(config, output_dir=str(tmp_path)))
    _assert_equal_within_ckks(node_results(tmp_path, config), outcome, reference)
    channel = outcome.channel
    assert channel.counts["joined"] == 1 and channel.counts["repeat"] == 2
    got, want = channel.view, reference.fusion_view
    assert got.counts == want.counts
    ledger, expected = got.ledger(), want.ledger()
    for kind in ("rounds", "forwards", "backwards"):
        np.testing.assert_array_equal(ledger[kind], expected[kind], err_msg=kind)
    for kind in ("bytes_up", "bytes_down"):  # in ciphertexts (each side's own size)
        np.testing.assert_allclose(
            ledger[kind] / got.public["ciphertext_bytes"],
            expected[kind] / want.public["ciphertext_bytes"],
            rtol=1e-6,
            err_msg=kind,
        )
    assert _learning_rounds(outcome) == 6 * outcome.learn_steps
    # Before: the same run with no repeat and no join (the flow of main).
    monkeypatch.setattr(ffs._Server, "repeats", property(lambda self: False))
    before = drive_in_process(FedSlateFlowerRun(config, output_dir=str(tmp_path / "before")))
    assert _learning_rounds(before) == 9 * before.learn_steps
    assert before.channel.counts["repeat"] == before.channel.counts["joined"] == 0
    assert before.channel.view.counts == want.counts
