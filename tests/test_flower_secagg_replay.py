"""Issue 33, the cross-run replay gap of secure aggregation's identities on Flower (KNOWN GAP).

The malicious-server protocol's advertisement signature binds the registry digest, the round,
the party and its two keys (``advertisement_message``), not the run; on Flower every run counts
its rounds from 0 and a federation keeps its enrolment (one registry) from run to run. So a
server that holds an earlier run's round secrets of ``t`` of a victim's neighbours (their
``Context.state`` while that round was open: the ``c``, ``s`` private keys are kept there from
AdvertiseKeys until Unmasking) replays those parties' signed round-0 advertisements of the
earlier run as their advertisements in round 0 of a new run. The victim's checks pass, it seals
its Shamir shares of its self-mask seed ``b`` and of its mask key ``s`` to the old ``c`` keys,
and the server opens ``t`` of each and decodes the victim node's masked sum, with no dropout
lie (which the ConsistencyCheck would catch).

This test shows the attack works today (it passes while the gap is open). The fix, not made
here (docs/flower.md, Limits; SECURITY.md): the FedSlate relay keys' design
(tests/test_flower_fedslate_freshness.py), every node's fresh nonce in the signed
advertisement's transcript; when it lands this test must be turned around (the replay refused
by name, nothing decoded).
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
from securefed.flower import records as rec
from securefed.flower.client import SECAGG_STATE
from securefed.flower.identity import provision_identities
from securefed.flower.protocol import partition_users
from securefed.flower.server import ADVERTISE, MASK, SHARE
from securefed.transport.secagg.signatures import SIGNATURE_BYTES

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
    every party's signed advertisement (it relayed them) and, from every node's
    ``Context.state`` while the round was open (the leak), the party's ``c`` and ``s`` keys."""

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
    return adverts, tap.leaked


def test_an_advertisement_replayed_from_an_earlier_run_decodes_the_victim_known_gap(
    example, tmp_path
):
    enrolment = _enrol(tmp_path)
    app = _attack_app(example, "malicious")  # seed 0
    earlier = example.FedMFApp(**{**vars(app), "seed": 1})  # another run: other round keys
    adverts, leaked = _earlier_run(example, earlier, enrolment)

    class Replaying(KeyRelayingServer):
        """The victim's ShareKeys and MaskedInput requests carry ``t`` of its neighbours'
        earlier-run advertisements (keys and signatures); nothing else is touched."""

        def __init__(self, grid) -> None:
            super().__init__(grid)
            _provisioned(grid, enrolment)

        def _replayed(self, arrays, names):
            neighbours = arrays["neighbours"][0].tolist()
            out = dict(arrays)
            for name, index, width in names:
                rows = rec.rows_bytes(arrays[name][0])
                rows = [
                    adverts[v][index] if v in self.fakes else row
                    for v, row in zip(neighbours, rows, strict=True)
                ]
                out[name] = rec.bytes_rows(rows, width)[None]
            return out

        def rewrite(self, kind, node, arrays, config):
            if kind == SHARE and int(arrays["users"][0]) == 0:
                neighbours = arrays["neighbours"][0].tolist()
                t = int(config["threshold"])
                self.fakes = {v: kx.keypair_from_seed(leaked[v][0]) for v in neighbours[:t]}
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

    state = _run("in-process", example, app, NODES, wrap=Replaying)
    server = state["grid"]
    # The victim took the replayed advertisements (it sealed its shares and masked its sum)...
    assert server.fakes and any(k == MASK for k, *_ in server.replies), state.get("error")
    decoded = server.decode_victim()
    assert decoded is not None, "the replayed advertisements were refused: turn this test around"
    # ... and the server decodes the victim node's sum exactly (to its stochastic rounding).
    expected = _plain_sum_of_victim(example, app)
    bound = USERS / app.secagg_scale
    np.testing.assert_allclose(decoded[: expected.size], expected, atol=bound)
