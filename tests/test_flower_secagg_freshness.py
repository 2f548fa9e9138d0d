"""Issue 33: the run's nonce transcript of secure aggregation on Flower, message by message.

Every node gives the run a fresh nonce (``query.secagg_nonce``, once per run), the server relays
every node's nonce with each AdvertiseKeys, and every signature of the run binds their digest
(:mod:`securefed.flower.freshness`; the replay these stop: tests/test_flower_secagg_replay.py).
Here: a server that drops, duplicates, substitutes or truncates a nonce, shows two nodes two
transcripts, or changes the transcript within the run is refused, by name; a node gives one
nonce a run and signs nothing before it; a resumed run gets a fresh transcript; the nonces
change no model (seeded mode still equals one process: tests/test_flower_secure.py,
tests/test_flower_secagg_merge.py).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from flwr.app import Message
from test_claims_flower import DirectGrid, task_identity
from test_flower_secure import Wiretap, _attack_app, _run

from securefed.flower import freshness, make_client_app, run_federation
from securefed.flower import records as rec
from securefed.flower.client import RUN_STATE
from securefed.flower.journal import STATE_DIR_KEY
from securefed.flower.server import ADVERTISE, NONCE, SHARE, UNMASK
from securefed.transport.secagg.signatures import SignatureError

assert task_identity  # the fixture, imported for the tests that build messages themselves

NODES = 5  # _attack_app: 40 users, 8 a node; a node's member id is its lowest user (0, 8, ...)


class NonceTamperer(Wiretap):
    """Rewrites the nonces round 0's AdvertiseKeys requests relay (``nonce.<member>``):
    ``change(arrays, node)`` returns the new nonce arrays of the message to ``node``."""

    def __init__(self, grid, change) -> None:
        super().__init__(grid)
        self.change = change

    def rewrite(self, kind, node, arrays, config):
        if kind != ADVERTISE:
            return None
        nonces = {k: v for k, v in arrays.items() if k.startswith("nonce.")}
        kept = {k: v for k, v in arrays.items() if not k.startswith("nonce.")}
        return kept | self.change(nonces, node)


def _drop(nonces, node):
    return {k: v for k, v in nonces.items() if k != "nonce.0"}


def _substitute(nonces, node):
    return nonces | {"nonce.0": np.full(freshness.NONCE_BYTES, 7, np.uint8)}


def _duplicate(nonces, node):
    return nonces | {"nonce.8": nonces["nonce.0"]}


def _truncate(nonces, node):
    return nonces | {"nonce.0": nonces["nonce.0"][:16]}


def _split(nonces, node):
    """Node 100 (member 0) alone is shown another nonce of member 8: two transcripts."""
    if node != 100:
        return nonces
    return nonces | {"nonce.8": np.full(freshness.NONCE_BYTES, 9, np.uint8)}


@pytest.mark.parametrize(
    "change, stage, cause",
    [
        (_drop, ADVERTISE, "does not find its own set-up nonce in its place .*its nonce dropped"),
        (_substitute, ADVERTISE, "own set-up nonce in its place .*a nonce substituted"),
        (_duplicate, ADVERTISE, "nonces that repeat"),
        (_truncate, ADVERTISE, "that are not 32 bytes"),
        (_split, SHARE, "does not verify over this run's nonce transcript"),
    ],
    ids=["dropped", "substituted", "duplicated", "truncated", "split"],
)
def test_a_server_that_tampers_with_the_run_nonces_is_refused(example, change, stage, cause):
    app = _attack_app(example, "malicious")
    state = _run("in-process", example, app, NODES, wrap=lambda g: NonceTamperer(g, change))
    error = state.get("error")
    assert isinstance(error, SignatureError), error
    assert f"refused {stage}" in str(error)
    assert re.search(cause, str(error)), error
    # Refused before any node masked anything: nothing of any user's update left a node.
    assert not any("masked" in a for _, _, a, _ in state["grid"].replies)


class AheadTranscriptChanger(Wiretap):
    """Advertising ahead, round 0's Unmasking message carries round 1's AdvertiseKeys with
    member 8's nonce changed for node 100: a second transcript in one run."""

    def rewrite(self, kind, node, arrays, config):
        if kind == UNMASK and node == 100 and "next.clients" in arrays:
            return arrays | {"next.nonce.8": np.full(freshness.NONCE_BYTES, 3, np.uint8)}
        return None


def test_a_second_transcript_within_the_run_is_refused(example):
    app = example.FedMFApp(
        **{
            **vars(_attack_app(example, "malicious")),
            "rounds": 2,
            "secagg_merge": True,
            "secagg_advertise_ahead": True,
        }
    )
    state = _run("in-process", example, app, NODES, wrap=AheadTranscriptChanger)
    error = state.get("error")
    assert isinstance(error, SignatureError), error
    assert f"refused {UNMASK}" in str(error)
    assert "already signed this run's advertisements over other nonces" in str(error)


def _ask(grid, node: int, kind: str, arrays, config) -> Message:
    message = Message(
        rec.content(arrays, config), dst_node_id=node, message_type=kind, group_id="0"
    )
    [mid] = grid.push_messages([message])
    [reply] = grid.pull_messages([mid])
    return reply


@pytest.mark.usefixtures("task_identity")
def test_a_node_gives_one_nonce_a_run_and_advertises_only_after_it(example):
    app = _attack_app(example, "malicious")
    state = _run("in-process", example, app, NODES, wrap=Wiretap)
    assert "error" not in state, state.get("error")
    _, advertise, config = state["grid"].first(state["grid"].sent, ADVERTISE, 101)
    grid = DirectGrid(make_client_app(lambda c: example.client_setup(app, c)), NODES)
    # A node of a fresh run asked to advertise before it gave its nonce: refused.
    reply = _ask(grid, 101, ADVERTISE, advertise, config)
    assert "before giving this run its nonce" in rec.message_config(reply)[rec.REFUSAL]
    # It gives one nonce; a second ask in the same run is refused and changes nothing.
    first = _ask(grid, 101, NONCE, {}, {"round": 0, "resumed_from": 0})
    assert rec.REFUSAL not in rec.message_config(first)
    given = freshness.relayed_nonces(rec.message_arrays(first))
    assert list(given) == [8] and len(given[8]) == freshness.NONCE_BYTES
    again = _ask(grid, 101, NONCE, {}, {"round": 0, "resumed_from": 0})
    assert (
        "already gave this run's secure aggregation its nonce"
        in (rec.message_config(again)[rec.REFUSAL])
    )
    assert bytes(grid.contexts[101].state[RUN_STATE]["nonce"]) == given[8]


class Crash(Exception):
    """The ServerApp dying after a round (its checkpoint written)."""


@pytest.mark.usefixtures("task_identity")
def test_a_resumed_run_gets_a_fresh_transcript(example, tmp_path):
    """A resumed run is a new run: its nodes give fresh nonces (seeded mode too: the nonce's
    path holds ``resumed_from``), so no signature of the crashed run verifies in it."""
    app = example.FedMFApp(
        seed=0,
        rounds=2,
        transport="secagg",
        min_nodes=3,
        timeout=30.0,
        checkpoint_dir=str(tmp_path / "checkpoint"),
    )

    def one_run(crash_after=None):
        setup = example.server_setup(app)
        if crash_after is not None:

            def on_round(round_id, metrics):
                if round_id == crash_after:
                    raise Crash(round_id)

            setup.on_round = on_round
        grid = DirectGrid(make_client_app(lambda c: example.client_setup(app, c)), 3)
        for context in grid.contexts.values():
            context.node_config[STATE_DIR_KEY] = str(tmp_path / "nodes")
        with contextlib.suppress(Crash):
            result = run_federation(grid, setup)
        nonces = {}
        for kind, _, _, reply in grid.log:
            if kind == NONCE:
                nonces |= freshness.relayed_nonces(rec.message_arrays(reply))
        return grid, nonces, locals().get("result")

    _, crashed, _ = one_run(crash_after=0)
    grid, resumed, result = one_run()
    assert result is not None and result.resumed_from == 1
    assert sorted(crashed) == sorted(resumed) and len(crashed) == 3
    assert not set(crashed.values()) & set(resumed.values())
    # The resumed run's advertisements relay its own nonces only.
    for kind, _, message, _ in grid.log:
        if kind == ADVERTISE:
            assert freshness.relayed_nonces(rec.message_arrays(message)) == resumed
