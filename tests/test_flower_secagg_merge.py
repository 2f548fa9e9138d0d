"""Issue 33 (cost): ShareKeys and MaskedInputCollection in one Flower message round.

``FlowerRunOptions.merge_share_mask`` (the FedMF app's ``secagg-merge``) sends each node its
ShareKeys request together with the broadcast and its computing users; the node answers with
its sealed shares and its masked sum at once (docs/flower.md, "Fewer message rounds").

Must hold: the same model as the separate message rounds (same seed: bit-identical), one
message round fewer; a server deviating in the merged message gets nothing it could not get
before: a substituted neighbour key is refused before anything is masked (malicious-server
protocol; against the honest-but-curious one the victim masks with the server's keys, which is
what that protocol's trust model allows), a second masking or sharing in the round is refused
(two masked sums under one self mask would reveal their difference), and a node lost in the
merged round refuses the round instead of leaving masks nobody can remove. Every run is the
real ``run_federation`` and the real ClientApps, in this process (``DirectGrid``).

Each test runs for both apps that carry secure aggregation's message rounds through the shared
``securefed.flower`` code (``algo``): the FedMF example and FedHPD (``securefed.rl
.flower_fedhpd``, two agents a node; its model is every round's consensus).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from flwr.app import Message
from test_flower_secure import SurvivorSetLiar, Wiretap, _run

from securefed.crypto import keys as kx
from securefed.errors import AggregationError
from securefed.flower import records as rec
from securefed.flower.floors import NodeFloors
from securefed.flower.protocol import FlowerRunOptions
from securefed.flower.server import (
    ADVERTISE,
    CONSISTENCY,
    EVALUATE,
    MASK,
    NONCE,
    SHARE,
    SHARE_MASK,
    UNMASK,
    ServerSetup,
    run_federation,
)
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg.signatures import ConsistencyError, SignatureError

HBC = "honest_but_curious"


class FedMFCase:
    """The FedMF example app (``recsys/flower_app``): 10 users a node (40 from 4 nodes)."""

    name = "fedmf"

    def __init__(self, example) -> None:
        self.example = example

    def users(self, nodes: int) -> int:
        return 30 if nodes <= 3 else 40

    def app(self, server="malicious", merge=False, ahead=False, *, rounds=2, nodes=3, **extra):
        return self.example.FedMFApp(
            seed=0,
            rounds=rounds,
            transport="secagg",
            secagg_server=server,
            secagg_merge=merge,
            secagg_advertise_ahead=ahead,
            min_nodes=nodes,
            synthetic_users=self.users(nodes),
            secagg_neighbours=extra.get("neighbours", 0),
            timeout=extra.get("timeout", 600.0),
        )

    def model(self, state) -> list[np.ndarray]:
        return [state["setup"].algorithm.V]

    def plaintext_with_merge(self):
        return self.example.FedMFApp(transport="plaintext", secagg_merge=True)

    def plaintext_setup(self):
        return self.example.server_setup(self.example.FedMFApp(seed=0, transport="plaintext"))


class FedHPDCase:
    """FedHPD on Flower (``securefed.rl.flower_fedhpd``) behind the interface ``_run`` calls
    (``server_setup(app)``, ``client_setup(app, context, floors)``): CartPole, two agents a
    node, one episode and one transport round a training round (d = 1, one loop, one part)."""

    name = "fedhpd"

    def __init__(self) -> None:
        from securefed.rl import flower_fedhpd

        self.fh = flower_fedhpd
        self.example = self

    def users(self, nodes: int) -> int:
        return 2 * nodes

    def config(self, rounds: int, nodes: int):
        from securefed.rl.fedhpd import FedHPDConfig
        from securefed.rl.policies import AGENTS

        return FedHPDConfig(
            task="cartpole",
            d=1,
            rounds=rounds,
            agent_specs=tuple(AGENTS["cartpole"][: self.users(nodes)]),
            public_size=12,
            part_size=12,
            distill_loops=1,
            virtual_rounds=8,
        )

    def app(self, server="malicious", merge=False, ahead=False, *, rounds=2, nodes=3, **extra):
        run = self.fh.FedHPDFlowerRun(
            self.config(rounds, nodes),
            seed=0,
            min_nodes=nodes,
            timeout=extra.get("timeout", 600.0),
            rejoin_window=rounds,  # every round's consensus stays in the server's history
            merge_share_mask=merge,
            advertise_ahead=ahead,
        )
        secagg = SecAggConfig(
            bits=64, scale=2.0**40, clip=1.0, server=server, neighbours=extra.get("neighbours")
        )
        return self.fh.FedHPDApp(run, "secagg", secagg)

    def server_setup(self, app):
        config = app.run.config
        public = np.random.default_rng(0).normal(0, 0.1, (config.public_size, config.spec.obs_dim))
        return self.fh.server_setup(app.run, app.make_transport(), public.astype(np.float32))

    def client_setup(self, app, context, floors=None):
        return self.fh.client_setup(app.run, context, floors)

    def model(self, state) -> list[np.ndarray]:
        history = state["setup"].algorithm.history
        assert sorted(history) == list(range(state["setup"].options.rounds))
        return [history[r][0] for r in sorted(history)]

    def plaintext_with_merge(self):
        run = self.fh.FedHPDFlowerRun(self.config(1, 3), seed=0, merge_share_mask=True)
        return self.fh.FedHPDApp(run, "plaintext")

    def plaintext_setup(self):
        return self.fh.server_setup(self.fh.FedHPDFlowerRun(self.config(1, 3), seed=0))


@pytest.fixture(params=["fedmf", "fedhpd"])
def algo(request):
    if request.param == "fedmf":
        return FedMFCase(request.getfixturevalue("example"))
    request.getfixturevalue("torch_one_thread")
    return FedHPDCase()


def _same_model(algo, got, want) -> None:
    got, want = algo.model(got), algo.model(want)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def _kinds(tap: Wiretap) -> list[str]:
    """The message types of round 0, in the order the server sent them (once each)."""
    return list(dict.fromkeys(kind for kind, *_ in tap.sent))


@pytest.mark.parametrize("server", ["malicious", HBC])
def test_the_merged_round_gives_the_separate_rounds_model_in_one_message_round_fewer(algo, server):
    floors = None if server == "malicious" else NodeFloors(HBC)
    ex = algo.example
    separate = _run("in-process", ex, algo.app(server, False), 3, wrap=Wiretap, floors=floors)
    merged = _run("in-process", ex, algo.app(server, True), 3, wrap=Wiretap, floors=floors)
    assert "error" not in separate and "error" not in merged, merged.get("error")
    _same_model(algo, merged, separate)
    consistency = [CONSISTENCY] if server == "malicious" else []
    nonce = [NONCE] if server == "malicious" else []  # once per run: the nonce transcript
    assert _kinds(separate["grid"]) == [*nonce, ADVERTISE, SHARE, MASK, *consistency, UNMASK]
    assert _kinds(merged["grid"]) == [*nonce, ADVERTISE, SHARE_MASK, *consistency, UNMASK]
    # Every node still sealed its shares and uploaded one masked sum, in each of the 2 rounds.
    replies = [a for kind, _, a, _ in merged["grid"].replies if kind == SHARE_MASK]
    assert len(replies) == 3 * 2 and all("masked" in a and "sealed" in a for a in replies)
    # The server's own count: one message round fewer per training round.
    counts, before = merged_counts(merged), merged_counts(separate)
    assert counts[SHARE_MASK] == 2 and SHARE not in counts and MASK not in counts
    assert before[SHARE] == before[MASK] == 2 and SHARE_MASK not in before
    assert sum(counts.values()) == sum(before.values()) - 2


class MergedKeyRelay(Wiretap):
    """In the victim's (party 0's) merged message the server puts its own ``c`` AND ``s``
    keys for ``2t - k`` neighbours: the victim would seal their shares to the server and mask
    with pairwise seeds the server can compute."""

    def __init__(self, grid) -> None:
        super().__init__(grid)
        self.fakes: dict[int, kx.KeyPair] = {}

    def rewrite(self, kind, node, arrays, config):
        if kind != SHARE_MASK or int(arrays["users"][0]) != 0:
            return None
        neighbours = arrays["neighbours"][0].tolist()
        t, k = int(config["threshold"]), len(neighbours)
        self.fakes = {
            v: kx.keypair_from_seed(bytes([v % 250 + 1]) * 32) for v in neighbours[: 2 * t - k]
        }
        swapped = {}
        for name in ("c_publics", "s_publics"):
            keys = rec.rows_bytes(arrays[name][0])
            keys = [
                self.fakes[v].public if v in self.fakes else key
                for v, key in zip(neighbours, keys, strict=True)
            ]
            swapped[name] = rec.bytes_rows(keys, kx.PUBLIC_KEY_BYTES)[None]
        return arrays | swapped

    def victim_reply(self) -> dict:
        for kind, _, arrays, config in self.replies:
            if kind == SHARE_MASK and int(arrays.get("party", -1)) == 0:
                return arrays
            if kind == SHARE_MASK and rec.REFUSAL in config and "party" not in arrays:
                return {"refusal": config[rec.REFUSAL]}
        raise LookupError("the victim did not answer")


def test_a_server_substituting_keys_in_the_merged_message_is_refused_before_masking(algo):
    """5 nodes (k = 4, t = 3). Malicious-server protocol: the victim refuses the merged message
    (the substituted advertisements do not verify): no share sealed, no masked sum sent, the
    round refused. Honest-but-curious protocol (the nodes allowing it): the same message is
    answered with shares sealed to the server's keys and a sum masked with its ``s`` keys,
    so the refusal above is the signature check's doing, not the merge's."""
    attack = {"rounds": 1, "nodes": 5, "neighbours": 4, "timeout": 120.0}
    app = algo.app("malicious", True, **attack)
    state = _run("in-process", algo.example, app, 5, wrap=MergedKeyRelay)
    error = state.get("error")
    assert isinstance(error, SignatureError), error
    assert "does not verify" in str(error) and SHARE_MASK in str(error)
    reply = state["grid"].victim_reply()
    assert "masked" not in reply and "sealed" not in reply
    assert "total" not in state["setup"].transport.view.rounds[0].aggregate

    weak = algo.app(HBC, True, **attack)
    state = _run("in-process", algo.example, weak, 5, wrap=MergedKeyRelay, floors=NodeFloors(HBC))
    reply = state["grid"].victim_reply()
    assert state["grid"].fakes and "masked" in reply and "sealed" in reply


class SecondMasking(Wiretap):
    """After the merged round, before ConsistencyCheck, the server asks the victim's node once
    more: a separate MaskedInput message for ONE of its users (two masked sums under one self
    mask differ by the other users' updates), and a replayed merged message. It keeps the
    replies."""

    def __init__(self, grid) -> None:
        super().__init__(grid)
        self.extra: dict[str, dict] = {}

    def push_messages(self, messages):
        messages = list(messages)
        if not self.extra and any(m.metadata.message_type == CONSISTENCY for m in messages):
            node, arrays, config = self.first(self.sent, SHARE_MASK)
            mask = arrays | {"clients": arrays["clients"][:1]}
            for kind, body in ((MASK, mask), (SHARE_MASK, arrays)):
                message = Message(
                    rec.content(body, config), dst_node_id=node, message_type=kind, group_id="0"
                )
                [mid] = self.grid.push_messages([message])
                [reply] = self.grid.pull_messages([mid])
                if reply.has_error():  # the ClientApp failed instead of refusing
                    self.extra[kind] = {"error": reply.error.reason, "arrays": set()}
                    continue
                self.extra[kind] = dict(rec.message_config(reply)) | {
                    "arrays": set(rec.message_arrays(reply))
                }
        return super().push_messages(messages)


def test_a_second_masking_or_sharing_after_the_merged_message_is_refused(algo):
    """The node refuses the second MaskedInput by its stage before its users train again (a
    FedHPD node that trained again would first fail on its own schedule: an error, not the
    refusal)."""
    app = algo.app(merge=True, rounds=1)
    state = _run("in-process", algo.example, app, 3, wrap=SecondMasking)
    extra = state["grid"].extra
    assert set(extra) == {MASK, SHARE_MASK}
    for kind, reply in extra.items():
        assert rec.REFUSAL in reply and "masked" not in reply["arrays"], (kind, reply)
    assert "already answered MaskedInputCollection" in extra[MASK][rec.REFUSAL]
    # The node refused, deleted its secrets and refuses the rest of the round: nothing unmasked.
    assert isinstance(state.get("error"), AggregationError), state.get("error")
    assert "total" not in state["setup"].transport.view.rounds[0].aggregate


class LosesMergedMessage(Wiretap):
    """The merged message to one node is lost (it never answers)."""

    def push_messages(self, messages):
        messages = list(messages)
        lost = [m for m in messages if m.metadata.message_type == SHARE_MASK][-1:]
        kept = [m for m in messages if m not in lost]
        ids = iter(super().push_messages(kept))
        return ["" if m in lost else next(ids) for m in messages]


def test_a_node_lost_in_the_merged_message_refuses_the_round(algo):
    """Its neighbours masked with it but it sealed no shares: the server refuses the round,
    naming the merge, before anything is unmasked (separate rounds: the node would have been
    lost before masking with its shares relayed, a dropout the others recover from)."""
    app = algo.app(merge=True, rounds=1)
    state = _run("in-process", algo.example, app, 3, wrap=LosesMergedMessage)
    error = state.get("error")
    assert isinstance(error, AggregationError) and "cannot be removed" in str(error), error
    assert not any(kind in (CONSISTENCY, UNMASK) for kind, *_ in state["grid"].sent)


def test_a_server_lying_about_dropouts_under_the_merged_flow_is_refused(algo):
    """4 nodes (k = 3, t = 2), both merges: the server tells some helpers at ConsistencyCheck
    that the victim (party 0) dropped though it uploaded its masked sum in the merged message.
    The helpers signed different survivor sets, so one holds fewer than t valid signatures on
    its own and refuses: the round is refused and no helper reveals a contributor's mask key,
    as with the separate message rounds (tests/test_flower_secure.py)."""
    app = algo.app(merge=True, ahead=True, rounds=1, nodes=4, timeout=120.0)
    state = _run("in-process", algo.example, app, 4, wrap=SurvivorSetLiar)
    assert state["grid"].lied_to
    assert SHARE_MASK in _kinds(state["grid"]) and MASK not in _kinds(state["grid"])
    error = state.get("error")
    assert isinstance(error, ConsistencyError | SignatureError), error
    assert "refused" in str(error)
    assert "total" not in state["setup"].transport.view.rounds[0].aggregate
    revealed_s_of_victim = [
        arrays
        for kind, _, arrays, _ in state["grid"].replies
        if kind == UNMASK
        and "owners" in arrays
        and 0 in arrays["owners"][arrays["kinds"] == 1].tolist()
    ]
    assert not revealed_s_of_victim


def test_merging_is_refused_where_there_is_nothing_to_merge(algo):
    with pytest.raises(ValueError, match="secagg-merge"):
        algo.plaintext_with_merge()
    setup = algo.plaintext_setup()
    options = dataclasses.replace(setup.options, merge_share_mask=True)
    with pytest.raises(ValueError, match="merge_share_mask"):
        run_federation(None, dataclasses.replace(setup, options=options))
    assert isinstance(options, FlowerRunOptions) and isinstance(setup, ServerSetup)


# ----------------------------------------------------------------------------- advertise ahead
def merged_counts(state) -> dict[str, int]:
    """The server's count of message rounds by type (``FlowerRunResult.message_rounds``)."""
    return state["result"].message_rounds


def _ahead_app(algo, **changes):
    return algo.app("malicious", True, True, **changes)


class Counting(Wiretap):
    """Every message type the server sends, by round (all rounds)."""

    def __init__(self, grid) -> None:
        super().__init__(grid)
        self.by_round: dict[int, list[str]] = {}

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            kinds = self.by_round.setdefault(int(rec.message_config(m).get("round", -1)), [])
            if m.metadata.message_type not in kinds:
                kinds.append(m.metadata.message_type)
        return super().push_messages(messages)


def test_advertising_ahead_gives_the_same_model_in_three_message_rounds(algo):
    """Malicious-server protocol, ShareKeys + MaskedInput merged and the next AdvertiseKeys
    with Unmasking: after round 0, three message rounds a round; the same model as the five
    separate message rounds. The run's nonces (``query.secagg_nonce``) are one message round
    per run, before round 0."""
    separate = _run("in-process", algo.example, algo.app("malicious", False), 3)
    ahead = _run("in-process", algo.example, _ahead_app(algo), 3, wrap=Counting)
    assert "error" not in ahead, ahead.get("error")
    assert ahead["grid"].by_round[0] == [NONCE, ADVERTISE, SHARE_MASK, CONSISTENCY, UNMASK]
    assert ahead["grid"].by_round[1] == [SHARE_MASK, CONSISTENCY, UNMASK, EVALUATE]
    _same_model(algo, ahead, separate)


class AheadForTheSameRound(Wiretap):
    """In round 0's Unmasking message the server asks for AdvertiseKeys of round 0 again (not
    round 1): after unmasking the node deleted round 0's secrets, so a fresh advertisement
    would restart round 0 (in seeded mode with the same keys and self-mask seed: a second
    masked sum under one self mask)."""

    def rewrite(self, kind, node, arrays, config):
        if kind == UNMASK and "next.clients" in arrays:
            config["next.round"] = 0
            return arrays
        return None


def test_an_advertisement_ahead_for_another_round_than_the_next_is_refused(algo):
    state = _run("in-process", algo.example, _ahead_app(algo), 3, wrap=AheadForTheSameRound)
    error = state.get("error")
    assert isinstance(error, AggregationError), error
    assert "must be for round 1" in str(error)
    assert not any(k.startswith("next.") for _, _, a, _ in state["grid"].replies for k in a)


class LosesOneUnmaskReply(Wiretap):
    """The first Unmasking reply (round 0's, with that node's advertisement for round 1) is
    lost: the server never pulls it."""

    lost_node: int | None = None

    def pull_messages(self, message_ids):
        kept = []
        for reply in super().pull_messages(message_ids):
            kind = self._kinds.get(reply.metadata.reply_to_message_id)
            if self.lost_node is None and kind == UNMASK:
                self.lost_node = int(reply.metadata.src_node_id)
                continue
            kept.append(reply)
        return kept


def test_a_node_whose_reply_with_the_advertisement_ahead_is_lost_sits_the_next_round_out(
    algo,
):
    """4 nodes (k = 3, t = 2): round 0 unmasks without the lost reply; round 1 runs among the
    other three nodes; in round 2 the node is asked to advertise again and takes part."""
    app = _ahead_app(algo, rounds=3, nodes=4, timeout=0.5)
    state = _run("in-process", algo.example, app, 4, wrap=LosesOneUnmaskReply)
    assert "error" not in state, state.get("error")
    lost = state["grid"].lost_node
    assert lost is not None
    replies = state["grid"].replies
    hosted = {node: set(a["hosted"].tolist()) for kind, node, a, _ in replies if kind == ADVERTISE}
    rounds = state["setup"].transport.view.rounds
    members = [
        {u for users in r.public["secagg_party_members"].values() for u in users} for r in rounds
    ]
    assert hosted[lost] <= members[0] and hosted[lost] <= members[2]
    assert not hosted[lost] & members[1]
    assert len(members[1]) == algo.users(4) - len(hosted[lost])


def test_the_servers_poll_backoff_is_validated():
    assert FlowerRunOptions(rounds=1).max_poll_interval == FlowerRunOptions(rounds=1).poll_interval
    with pytest.raises(ValueError, match="max_poll_interval"):
        FlowerRunOptions(rounds=1, poll_interval=0.1, max_poll_interval=0.05)
