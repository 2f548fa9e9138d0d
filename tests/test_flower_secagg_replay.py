"""Issue 33: secure aggregation's signed messages on Flower are bound to the run.

The malicious-server protocol's advertisement signature binds the registry digest, the round,
the party and its two keys (``advertisement_message``); on Flower every run counts its rounds
from 0 and a federation keeps its enrolment (one registry) from run to run. So a server that
holds an earlier run's round secrets of ``t`` of a victim's neighbours (their ``Context.state``
while that round was open: the ``c``, ``s`` private keys are kept there from AdvertiseKeys until
Unmasking) replayed those parties' signed round-0 advertisements of the earlier run as their
advertisements in round 0 of a new run; the victim's checks passed, it sealed its Shamir shares
of its self-mask seed ``b`` and of its mask key ``s`` to the old ``c`` keys, and the server
opened ``t`` of each and decoded the victim node's masked sum (this file's first test passed
on main with the attack working, as ``..._decodes_the_victim_known_gap``).

The fix (:mod:`securefed.flower.freshness`, the design of FedSlate's relay keys,
tests/test_flower_fedslate_freshness.py): once per run every node gives a fresh nonce
(``query.secagg_nonce``), the server relays every node's nonce with each AdvertiseKeys, each
node checks its own is in its place and none repeats, and every advertisement, member count
and ConsistencyCheck signature of the run binds the nonces' digest. An earlier run's signature
covers a transcript without the victim's fresh nonce: the victim refuses it, by name, and
seals nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_flower_secure import (
    KeyRelayingServer,
    Wiretap,
    _attack_app,
    _plain_sum_of_victim,
    _run,
)

from securefed.crypto import keys as kx
from securefed.flower import client as flower_client
from securefed.flower import records as rec
from securefed.flower.client import SECAGG_STATE
from securefed.flower.identity import provision_identities
from securefed.flower.protocol import partition_users
from securefed.flower.server import ADVERTISE, MASK, SHARE, UNMASK
from securefed.transport.secagg.signatures import SIGNATURE_BYTES, SignatureError

NODES, USERS = 5, 40  # _attack_app: k = 4 neighbours, threshold t = 3


def _enrol(tmp_path) -> dict[str, str]:
    """One enrolment for the federation (every node's users' identities), kept across runs."""
    partitions = {p: partition_users(USERS, NODES, p) for p in range(NODES)}
    digest = provision_identities(tmp_path, partitions)
    return {"registry": str(tmp_path / "registry.bin"), "digest": digest, "dir": str(tmp_path)}


def _provisioned(grid, enrolment) -> None:
    for context in grid.contexts.values():
        p = int(context.node_config["partition-id"])
        context.node_config["secagg-identity-path"] = f"{enrolment['dir']}/identity-{p}.bin"
        context.node_config["secagg-registry-path"] = enrolment["registry"]
        context.node_config["secagg-registry-digest"] = enrolment["digest"]


def _earlier_run(example, app, enrolment):
    """An honest earlier run of the same federation; what the server keeps of its round 0:
    every party's signed advertisement (it relayed them), the nonces it relayed with them
    (none on main) and, from every node's ``Context.state`` while the round was open (the
    leak), the party's ``c`` and ``s`` keys."""

    class Keeping(Wiretap):
        def __init__(self, grid) -> None:
            super().__init__(grid)
            _provisioned(grid, enrolment)
            self.leaked: dict[int, tuple[bytes, bytes]] = {}

        def rewrite(self, kind, node, arrays, config):
            if kind == SHARE:
                record = self.grid.contexts[node].state[SECAGG_STATE]
                party = int(arrays["users"][0])
                self.leaked[party] = (bytes(record[f"{party}.c"]), bytes(record[f"{party}.s"]))
            return None

    state = _run("in-process", example, app, NODES, wrap=Keeping)
    assert "error" not in state, state.get("error")
    tap = state["grid"]
    adverts = {}
    for kind, _, arrays, _ in tap.replies:
        if kind == ADVERTISE and "party" in arrays:
            [c], [s] = rec.rows_bytes(arrays["c_public"]), rec.rows_bytes(arrays["s_public"])
            [signature] = rec.rows_bytes(arrays["signature"])
            adverts[int(arrays["party"])] = (c, s, signature)
    _, request, _ = tap.first(tap.sent, ADVERTISE)
    nonces = {k: v for k, v in request.items() if k.startswith("nonce.")}
    return adverts, tap.leaked, nonces


def _earlier_unmask_requests(example, app, enrolment) -> dict[int, dict]:
    """An honest earlier run's round-0 Unmasking requests, by helper: the survivor-set
    endorsements and the signed member counts the server relayed in them."""

    class Keeping(Wiretap):
        def __init__(self, grid) -> None:
            super().__init__(grid)
            _provisioned(grid, enrolment)

    state = _run("in-process", example, app, NODES, wrap=Keeping)
    assert "error" not in state, state.get("error")
    return {
        int(arrays["helpers"][0]): arrays
        for kind, _, arrays, _ in state["grid"].sent
        if kind == UNMASK
    }


class Replaying(KeyRelayingServer):
    """The victim's ShareKeys and MaskedInput requests carry ``t`` of its neighbours'
    earlier-run advertisements (keys and signatures); with ``old_nonces``, every AdvertiseKeys
    request of the new run relays the earlier run's nonces too (so the replayed signatures are
    over the transcript the nodes are shown)."""

    def __init__(self, grid, enrolment, adverts, leaked, old_nonces=None) -> None:
        super().__init__(grid)
        _provisioned(grid, enrolment)
        self.adverts, self.leaked, self.old_nonces = adverts, leaked, old_nonces

    def _replayed(self, arrays, names):
        neighbours = arrays["neighbours"][0].tolist()
        out = dict(arrays)
        for name, index, width in names:
            rows = rec.rows_bytes(arrays[name][0])
            rows = [
                self.adverts[v][index] if v in self.fakes else row
                for v, row in zip(neighbours, rows, strict=True)
            ]
            out[name] = rec.bytes_rows(rows, width)[None]
        return out

    def rewrite(self, kind, node, arrays, config):
        if kind == ADVERTISE and self.old_nonces is not None:
            kept = {k: v for k, v in arrays.items() if not k.startswith("nonce.")}
            return kept | self.old_nonces
        if kind == SHARE and int(arrays["users"][0]) == 0:
            neighbours = arrays["neighbours"][0].tolist()
            t = int(config["threshold"])
            self.fakes = {v: kx.keypair_from_seed(self.leaked[v][0]) for v in neighbours[:t]}
            return self._replayed(
                arrays,
                [
                    ("c_publics", 0, kx.PUBLIC_KEY_BYTES),
                    ("s_publics", 1, kx.PUBLIC_KEY_BYTES),
                    ("signatures", 2, SIGNATURE_BYTES),
                ],
            )
        if kind == MASK and int(arrays["party"]) == 0 and self.fakes:
            return self._replayed(arrays, [("s_publics", 1, kx.PUBLIC_KEY_BYTES)])
        return None


def _replay(example, tmp_path, *, with_nonces: bool = False):
    """The earlier run (seed 1) and the replaying run (seed 0) over one enrolment."""
    enrolment = _enrol(tmp_path)
    app = _attack_app(example, "malicious")  # seed 0
    earlier = example.FedMFApp(**{**vars(app), "seed": 1})  # another run: other round keys
    adverts, leaked, nonces = _earlier_run(example, earlier, enrolment)
    old = nonces if with_nonces else None
    state = _run(
        "in-process",
        example,
        app,
        NODES,
        wrap=lambda grid: Replaying(grid, enrolment, adverts, leaked, old),
    )
    return app, state


def _victim_sealed_nothing(server) -> None:
    """Nothing of the victim left: no sealed shares, no masked sum, nothing to decode."""
    sealed = [
        a for kind, _, a, _ in server.replies if kind == SHARE and a.get("users", [-1])[0] == 0
    ]
    assert not [a for a in sealed if "sealed" in a]
    assert not any(kind == MASK for kind, *_ in server.replies)
    advertised = any(kind == ADVERTISE and "party" in a for kind, _, a, _ in server.replies)
    assert not advertised or server.decode_victim() is None


def test_an_advertisement_replayed_from_an_earlier_run_is_refused(example, tmp_path, monkeypatch):
    _, state = _replay(example, tmp_path / "bound")
    error = state.get("error")
    assert isinstance(error, SignatureError), f"the replay was not refused: {error!r}"
    assert f"refused {SHARE}" in str(error) and "replayed from another run" in str(error)
    assert "over this run's nonce transcript" in str(error)
    _victim_sealed_nothing(state["grid"])
    # The run binding disabled (every run's signatures over one fixed transcript, as on main
    # before the nonces): the victim takes the replayed keys and the server decodes its sum.
    monkeypatch.setattr(flower_client, "run_transcript", lambda nonces: b"\0" * 32)
    app, state = _replay(example, tmp_path / "unbound")
    server = state["grid"]
    assert server.fakes and any(k == MASK for k, *_ in server.replies), state.get("error")
    decoded = server.decode_victim()
    assert decoded is not None
    expected = _plain_sum_of_victim(example, app)
    np.testing.assert_allclose(decoded[: expected.size], expected, atol=USERS / app.secagg_scale)


def test_the_earlier_runs_nonces_relayed_with_its_advertisements_are_refused(example, tmp_path):
    """The server relays the earlier run's nonces too, so that the replayed signatures are over
    the transcript the nodes are shown: each node refuses a transcript without its own nonce,
    before it advertises anything."""
    _, state = _replay(example, tmp_path, with_nonces=True)
    error = state.get("error")
    assert isinstance(error, SignatureError), error
    assert f"refused {ADVERTISE}" in str(error)
    assert "does not find its own set-up nonce in its place" in str(error)
    server = state["grid"]
    assert not any(kind == ADVERTISE and "party" in a for kind, _, a, _ in server.replies)
    _victim_sealed_nothing(server)


class StatementReplaying(Wiretap):
    """At Unmasking the server hands every helper the earlier run's signed statements of the
    same round instead of this run's: the survivor-set endorsements (``signers``,
    ``signatures``) or the parties' member counts (``member_*``)."""

    def __init__(self, grid, enrolment, earlier, names) -> None:
        super().__init__(grid)
        _provisioned(grid, enrolment)
        self.earlier, self.names, self.replayed = earlier, names, 0

    def rewrite(self, kind, node, arrays, config):
        old = self.earlier.get(int(arrays["helpers"][0])) if kind == UNMASK else None
        if old is None:
            return None
        self.replayed += 1
        return arrays | {name: old[name] for name in self.names}


@pytest.mark.parametrize(
    "names, what",
    [
        (("signers", "signatures"), "survivor set"),
        (("member_parties", "member_counts", "member_signatures"), "member count"),
    ],
    ids=["survivor-set", "member-count"],
)
def test_signed_statements_replayed_from_an_earlier_run_are_refused(example, tmp_path, names, what):
    """The ConsistencyCheck endorsements and the signed member counts bind the run too: the
    earlier run's (same round, same parties, same survivors) do not verify in this one, and no
    helper reveals a share."""
    enrolment = _enrol(tmp_path)
    app = _attack_app(example, "malicious")
    earlier = _earlier_unmask_requests(
        example, example.FedMFApp(**{**vars(app), "seed": 1}), enrolment
    )
    state = _run(
        "in-process",
        example,
        app,
        NODES,
        wrap=lambda grid: StatementReplaying(grid, enrolment, earlier, names),
    )
    assert state["grid"].replayed, "no Unmasking request to replay into"
    error = state.get("error")
    assert isinstance(error, SignatureError), f"the replayed {what} was taken: {error!r}"
    assert f"refused {UNMASK}" in str(error) and what in str(error)
    assert "nonce transcript" in str(error)
    assert not any(kind == UNMASK and "owners" in a for kind, _, a, _ in state["grid"].replies)
