"""Secure aggregation's claims against a deviating server and a lying helper (issue 17, items 3, 4).

Each test replays an exploit a security review found against the protocol's public stage methods
(the ones ``securefed.flower`` carries across machines) and asserts the refusal that stops it.
The rules are Bonawitz et al. (CCS 2017), Sec. 4 and Fig. 4: a client answers each stage once,
reveals for each peer the share of ``b`` or of ``s``, never both, checks ``t > k/2`` and that at
least ``t`` peers survive before it reveals anything; the server takes no masked input once
unmasking began. A reconstruction is checked against every share received (Shamir shares are a
Reed-Solomon codeword), and the decoded sum against the range the fixed point allows.

These rules hold in both threat models; the tests drive the honest-but-curious variant's stage
methods (``server="honest_but_curious"``: no signatures, no ConsistencyCheck). The
malicious-server variant's signatures and ConsistencyCheck are tested in
tests/test_secagg_malicious.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import keys as kx
from securefed.crypto import prg, shamir
from securefed.crypto.keys import InvalidPublicKeyError
from securefed.errors import AggregationError, InsecureParameterError
from securefed.transport.secagg import (
    SecAggClient,
    SecAggConfig,
    SecAggTransport,
    masking_workspace,
)

HBC = "honest_but_curious"
D = 5
TRUE_VALUE = 0.25

P25519 = 2**255 - 19
LOW_ORDER_POINTS = {
    "zero": bytes(32),
    "one": (1).to_bytes(32, "little"),
    "order 8": bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    "order 8'": bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    "p - 1": (P25519 - 1).to_bytes(32, "little"),
    "p + 1 (non-canonical 1)": (P25519 + 1).to_bytes(32, "little"),
}


# ----------------------------------------------------------------------------- a server's tools
def _inputs(n: int) -> np.ndarray:
    """Distinct, recognisable inputs: client c sends 0.25 + c / 100 in every coordinate."""
    return TRUE_VALUE + np.arange(n)[:, None] / 100 * np.ones((n, D))


def _stages_until_masked(config, n, *, seeds=None, missing=(), keep_clients=None):
    """Run AdvertiseKeys, ShareKeys and MaskedInputCollection honestly on remote clients.

    Returns the server's round (remote clients: the server holds no client secret) and the
    clients (which a deviating server can drive through their public stage methods, as it does
    over Flower messages). ``missing`` clients do not upload a masked input (yet).
    """
    seeds = SeedTree(0) if seeds is None else seeds
    config = config.for_round(n)  # what the nodes are sent: the round's scale, fixed
    transport = SecAggTransport(
        config, remote_clients=True, keep_payloads=ALL_PAYLOADS, keep_masked=True
    )
    rnd = transport.open_round(0, range(n), shape=(1, D), seeds=seeds)
    clients = {c: SecAggClient(c, 0, config, seeds) for c in range(n)}
    rnd.receive_keys({c: clients[c].advertise() for c in range(n)})
    for c in range(n):
        request = rnd.share_request(c)
        sealed = clients[c].share(
            request.neighbours, request.xs, request.c_publics, request.threshold
        )
        rnd.receive_shares(c, sealed)
    x = _inputs(n)
    for c in range(n):
        if c not in missing:
            _mask_and_upload(rnd, clients[c], x[c], config)
    return rnd, clients


def _mask_and_upload(rnd, client, values, config):
    request = rnd.mask_request(client.id)
    masked, _ = client.mask(
        values, request.neighbours, request.s_publics, masking_workspace(len(values), rnd.config)
    )
    rnd.receive_masked(client.id, masked, weighted=False)


def _shamir_x(rnd, client: int) -> int:
    return int(rnd.view.positions([client])[0]) + 1


def _remove_masks(rnd, victim: int, b: bytes, s_private: bytes) -> np.ndarray:
    """What a server holding ``b_v`` and ``s_v`` decodes from the victim's masked upload."""
    config = rnd.config
    total = rnd.view.payload(victim)["masked"].copy()
    expander = prg.MaskExpander(len(total), bits=config.bits, prg=config.prg)
    expander.add(total, b, domain=prg.DOMAIN_SELF_MASK, sign=-1)
    private = kx.keypair_from_seed(s_private).private
    for u in rnd.neighbours(victim).tolist():
        seed = kx.pair_key(
            private, rnd.public_keys[u][1], kx.PURPOSE_PAIR_MASK, rnd.round_id, victim, u
        )
        expander.add(total, seed, domain=prg.DOMAIN_PAIR_MASK, sign=-1 if u > victim else 1)
    return config.fixed_point.decode(total)


def _ask_twice(rnd, clients, victim, *, restore=False):
    """The double-ask attack: each helper is asked to unmask once with the victim among the
    contributors (its ``b``-share) and once without (its ``s``-share); ``t`` of each rebuild
    ``b_v`` and ``s_v``, and the victim's raw vector comes out of its masked upload."""
    requests = rnd.unmask_requests()
    everyone = set(next(iter(requests.values())).contributors)
    b_points, s_points = [], []
    for helper, request in requests.items():
        if victim not in request.inbox:
            continue
        _, b_share = clients[helper].reveal(request.inbox, everyone)[victim]
        if restore:  # a Flower node restores its client from the saved secrets per message
            saved = clients[helper].export_secrets()
            clients[helper] = SecAggClient(helper, 0, rnd.config, SeedTree(0), secrets=saved)
        again = clients[helper].reveal(request.inbox, everyone - {victim})
        b_points.append((_shamir_x(rnd, helper), b_share))
        s_points.append((_shamir_x(rnd, helper), again[victim][1]))
    b = shamir.int_to_secret(shamir.reconstruct(b_points, rnd.threshold))
    s = shamir.int_to_secret(shamir.reconstruct(s_points, rnd.threshold))
    return _remove_masks(rnd, victim, b, s)


# ----------------------------------------------------------------------------- item 3: clients
@pytest.mark.parametrize("restore", [False, True])
def test_a_client_answers_unmasking_once_so_asking_twice_decodes_nothing(restore):
    config = SecAggConfig(server=HBC, neighbours=4)  # n = 6: k = 4, t = 3
    rnd, clients = _stages_until_masked(config, 6)
    with pytest.raises(AggregationError, match="once"):
        _ask_twice(rnd, clients, victim=2, restore=restore)


def test_a_server_lying_about_survivors_gets_at_most_one_secret_of_each_client():
    """Telling some helpers that the victim contributed (its ``b``-share) and others that it
    dropped (its ``s``-share): each helper answers once, and two disjoint groups of ``t > k/2``
    helpers do not fit among its ``k`` neighbours, whichever way the server splits them."""
    config = SecAggConfig(server=HBC, neighbours=4)  # n = 6: k = 4, t = 3
    victim = 2
    for split in range(2**4):
        rnd, clients = _stages_until_masked(config, 6)
        neighbours = rnd.neighbours(victim).tolist()
        told_dropped = {v for bit, v in enumerate(neighbours) if split >> bit & 1}
        points: dict[str, list[tuple[int, int]]] = {"b": [], "s": []}
        for helper, request in rnd.unmask_requests().items():
            contributors = set(request.contributors)
            if helper in told_dropped:
                contributors.discard(victim)
            for owner, (kind, value) in clients[helper].reveal(request.inbox, contributors).items():
                if owner == victim:
                    points[kind].append((_shamir_x(rnd, helper), value))
        assert min(len(points["b"]), len(points["s"])) < rnd.threshold
        short = "b" if len(points["b"]) < rnd.threshold else "s"
        with pytest.raises(ValueError, match="more are needed"):
            shamir.reconstruct(points[short], rnd.threshold)


def test_a_late_masked_input_is_refused_once_unmasking_began():
    """The server starts unmasking without the victim (its helpers reveal its ``s``-share), then
    takes the victim's late masked input and asks for the ``b``-shares: refused at both ends."""
    config = SecAggConfig(server=HBC, neighbours=4)
    victim = 2
    rnd, clients = _stages_until_masked(config, 6, missing=(victim,))
    requests = rnd.unmask_requests()
    contributors = set(next(iter(requests.values())).contributors)
    assert victim not in contributors
    revealed = {h: clients[h].reveal(r.inbox, contributors) for h, r in requests.items()}
    assert all(revealed[h][victim][0] == "s" for h in revealed if victim in revealed[h])
    with pytest.raises(AggregationError, match="unmasking"):
        _mask_and_upload(rnd, clients[victim], _inputs(6)[victim], config)
    assert victim not in rnd.submitted
    # In one process too: a submit after the helpers were asked is refused.
    local = SecAggTransport(config).open_round(0, range(6), shape=(1, D), seeds=SeedTree(0))
    for c in range(5):
        local.submit(c, np.full(D, TRUE_VALUE))
    local.unmask_requests()
    with pytest.raises(AggregationError, match="unmasking"):
        local.submit(5, np.full(D, TRUE_VALUE))


@pytest.mark.parametrize(
    ("threshold", "match"), [(1, "at most half"), (2, "at most half"), (5, "exceeds")]
)
def test_a_client_refuses_a_threshold_outside_half_its_neighbourhood(threshold, match):
    """With ``t = 1`` each share is the secret itself: one neighbour (or the server and one
    colluder) would hold the victim's self-mask seed and mask key."""
    config = SecAggConfig(server=HBC, neighbours=4)
    seeds = SeedTree(0)
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(6), shape=(1, D), seeds=seeds
    )
    clients = {c: SecAggClient(c, 0, config, seeds) for c in range(6)}
    rnd.receive_keys({c: clients[c].advertise() for c in range(6)})
    request = rnd.share_request(0)
    assert len(request.neighbours) == 4 and request.threshold == 3
    with pytest.raises(InsecureParameterError, match=match):
        clients[0].share(request.neighbours, request.xs, request.c_publics, threshold)


def test_a_client_reveals_nothing_unless_t_of_its_neighbours_contributed():
    """A server that declares most of a helper's neighbours dropped would collect their mask
    keys; the helper refuses when fewer than ``t`` of its neighbours are among the contributors."""
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6)
    requests = rnd.unmask_requests()
    helper, request = next(iter(requests.items()))
    neighbours = rnd.neighbours(helper).tolist()
    claimed = {helper, neighbours[0], neighbours[1]}  # 2 of 4 neighbours, t = 3
    with pytest.raises(AggregationError, match="2 of its 4 neighbours"):
        clients[helper].reveal(request.inbox, claimed)
    # The refusal revealed nothing and did not spend the stage: the honest request is answered.
    revealed = clients[helper].reveal(request.inbox, set(request.contributors))
    assert {kind for kind, _ in revealed.values()} == {"b"}


def test_a_client_answers_each_stage_once_and_in_order():
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6)
    client = clients[1]
    request = rnd.share_request(1)
    with pytest.raises(AggregationError, match="once"):
        client.share(request.neighbours, request.xs, request.c_publics, request.threshold)
    with pytest.raises(AggregationError, match="once"):
        _mask_and_upload(rnd, client, np.zeros(D), config)  # masking twice leaks x1 - x2
    with pytest.raises(AggregationError, match="once"):
        client.advertise()
    restored = SecAggClient(1, 0, config, SeedTree(0), secrets=client.export_secrets())
    with pytest.raises(AggregationError, match="once"):
        _mask_and_upload(rnd, restored, np.zeros(D), config)


def test_a_client_masks_only_with_the_neighbours_it_shared_with():
    """Masking with one neighbour only would let the server and that neighbour decode it."""
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6, missing=(0,))
    request = rnd.mask_request(0)
    workspace = masking_workspace(D, rnd.config)
    with pytest.raises(AggregationError, match="fewer than the threshold"):
        clients[0].mask(np.zeros(D), request.neighbours[:1], request.s_publics[:1], workspace)
    stranger = next(c for c in range(6) if c != 0 and c not in request.neighbours)
    with pytest.raises(AggregationError, match="did not share"):
        clients[0].mask(
            np.zeros(D),
            (*request.neighbours[:3], stranger),
            (*request.s_publics[:3], rnd.public_keys[stranger][1]),
            workspace,
        )


@pytest.mark.parametrize("name", sorted(LOW_ORDER_POINTS))
def test_low_order_public_keys_are_refused_with_a_clear_error(name):
    point = LOW_ORDER_POINTS[name]
    config = SecAggConfig(server=HBC, neighbours=4)
    seeds = SeedTree(0)
    clients = {c: SecAggClient(c, 0, config, seeds) for c in range(6)}
    keys = {c: clients[c].advertise() for c in range(6)}
    # The server refuses a client that advertises one.
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(6), shape=(1, D), seeds=seeds
    )
    with pytest.raises(InvalidPublicKeyError, match="client 3"):
        rnd.receive_keys(keys | {3: (point, keys[3][1])})
    # A client refuses one relayed for a neighbour, at ShareKeys (c key) and at masking (s key).
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(6), shape=(1, D), seeds=seeds
    )
    rnd.receive_keys(keys)
    request = rnd.share_request(0)
    peer = request.neighbours[1]
    c_publics = (request.c_publics[0], point, *request.c_publics[2:])
    with pytest.raises(InvalidPublicKeyError, match=f"client {peer}"):
        clients[0].share(request.neighbours, request.xs, c_publics, request.threshold)
    fresh = SecAggClient(0, 0, config, seeds)
    fresh.advertise()
    fresh.share(request.neighbours, request.xs, request.c_publics, request.threshold)
    mask = rnd.mask_request(0)
    s_publics = (mask.s_publics[0], point, *mask.s_publics[2:])
    with pytest.raises(InvalidPublicKeyError, match=f"client {peer}"):
        fresh.mask(np.zeros(D), mask.neighbours, s_publics, masking_workspace(D, rnd.config))


def test_a_non_canonical_public_key_is_refused():
    """Bit 255 is ignored by X25519: the same key under two encodings passes a duplicate check."""
    config = SecAggConfig(server=HBC, neighbours=4)
    seeds = SeedTree(0)
    keys = {c: SecAggClient(c, 0, config, seeds).advertise() for c in range(6)}
    flipped = bytearray(keys[1][1])
    flipped[31] |= 0x80
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(6), shape=(1, D), seeds=seeds
    )
    with pytest.raises(InvalidPublicKeyError, match=r"client 1.*canonical"):
        rnd.receive_keys(keys | {1: (keys[1][0], bytes(flipped))})


# ----------------------------------------------------------------------------- item 4: helpers
def _reveals(rnd, clients):
    return {
        h: clients[h].reveal(r.inbox, set(r.contributors)) for h, r in rnd.unmask_requests().items()
    }


def _lie(responses, liar, owner):
    kind, value = responses[liar][owner]
    responses[liar][owner] = (kind, (value + 12345) % shamir.PRIME)


def test_a_lying_helper_without_spare_shares_to_identify_it_refuses_the_round():
    """The review's exploit: one corrupted self-mask share and the server output garbage
    ([13461.98, 7645.01, ...] for a true 1.5) with no error. Four shares of a 3-of-4 secret
    show the lie but cannot tell who told it: the round is refused, naming the helpers."""
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6)
    responses = _reveals(rnd, clients)
    owner = 0
    liar = int(rnd.neighbours(owner)[1])
    _lie(responses, liar, owner)
    rnd.receive_reveals(responses)
    with pytest.raises(AggregationError, match=rf"client {owner}'s self-mask seed.*{liar}"):
        rnd.result()
    assert "total" not in rnd.view.aggregate and "ring_sum" not in rnd.view.aggregate


@pytest.mark.parametrize("kind", ["b", "s"])
def test_a_lying_helper_with_spare_shares_is_identified_and_excluded(kind):
    """Seven shares of a 4-of-7 secret correct one wrong share (Berlekamp-Welch): the liar is
    named in ``excluded_helpers`` and the sum is right."""
    config = SecAggConfig(server=HBC, neighbours=100)  # complete graph on 8: k = 7, t = 4
    owner = 0
    missing = (owner,) if kind == "s" else ()  # a non-contributor's mask key is rebuilt
    rnd, clients = _stages_until_masked(config, 8, missing=missing)
    if missing:
        rnd.drop(owner)
    responses = _reveals(rnd, clients)
    liar = 5
    assert responses[liar][owner][0] == kind
    _lie(responses, liar, owner)
    rnd.receive_reveals(responses)
    aggregate = rnd.result()
    members = [c for c in range(8) if c not in missing]
    expected = _inputs(8)[members].sum(axis=0)
    assert np.abs(aggregate.total.ravel() - expected).max() <= rnd.error_bound()
    assert rnd.excluded_helpers == frozenset({liar})
    assert rnd.view.aggregate["excluded_helpers"].tolist() == [liar]


def test_more_liars_than_the_spare_shares_correct_refuse_the_round():
    config = SecAggConfig(
        server=HBC, neighbours=100
    )  # k = 7, t = 4: one wrong share per secret corrected
    rnd, clients = _stages_until_masked(config, 8)
    responses = _reveals(rnd, clients)
    for liar in (3, 6):
        _lie(responses, liar, 0)
    rnd.receive_reveals(responses)
    with pytest.raises(AggregationError, match="client 0's self-mask seed"):
        rnd.result()
    assert "total" not in rnd.view.aggregate


def test_an_unverifiable_wrong_share_is_caught_by_the_range_of_the_sum():
    """With exactly ``t`` shares nothing can be checked; a wrong secret leaves a uniform ring
    sum, which falls outside ``[-n L, n L]`` (``L = ceil(clip scale)``) and is refused."""
    config = SecAggConfig(server=HBC, neighbours=2)  # n = 4: k = 2, t = 2, no spare share
    rnd, clients = _stages_until_masked(config, 4)
    responses = _reveals(rnd, clients)
    _lie(responses, int(rnd.neighbours(1)[0]), 1)
    rnd.receive_reveals(responses)
    with pytest.raises(AggregationError, match="outside the range"):
        rnd.result()
    assert "total" not in rnd.view.aggregate


def test_a_client_input_beyond_the_clip_range_is_refused_when_the_sum_leaves_its_range():
    """A client that adds to its masked upload cannot be seen by its masks, but a sum beyond what
    ``n`` clipped inputs can give is refused (values and weights). The fixed scale 2^16 leaves
    the ring room above ``n L`` for the 2^30-unit shift to fall outside it; the automatic scale
    leaves none (docs/secagg.md, fixed point)."""
    config = SecAggConfig(server=HBC, neighbours=4, scale=2.0**16)
    rnd, clients = _stages_until_masked(config, 6, missing=(5,))
    request = rnd.mask_request(5)
    masked, _ = clients[5].mask(
        np.zeros(D), request.neighbours, request.s_publics, masking_workspace(D, rnd.config)
    )
    masked[0] += np.uint32(2**30)
    rnd.receive_masked(5, masked, weighted=False)
    rnd.receive_reveals(_reveals(rnd, clients))
    with pytest.raises(AggregationError, match="outside the range"):
        rnd.result()


def test_a_wrong_share_of_a_mask_key_is_caught_by_the_public_key():
    """A dropped client's mask key rebuilt from exactly ``t`` shares is checked against the key it
    advertised: a wrong share is refused, naming the helpers."""
    config = SecAggConfig(server=HBC, neighbours=4)  # n = 6: k = 4, t = 3
    rnd, clients = _stages_until_masked(config, 6, missing=(0,))
    rnd.drop(0)
    responses = _reveals(rnd, clients)
    helpers = sorted(h for h in responses if 0 in responses[h])
    del responses[helpers[-1]][0]  # one mask-key share short: exactly t remain
    _lie(responses, helpers[0], 0)
    rnd.receive_reveals(responses)
    with pytest.raises(AggregationError, match=rf"client 0's rebuilt mask key.*{helpers[0]}"):
        rnd.result()
    assert "total" not in rnd.view.aggregate


# ----------------------------------------------------------------------------- malformed messages
def test_the_server_takes_each_unmasking_message_once_and_in_order():
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6)
    with pytest.raises(AggregationError, match="before unmask_requests"):
        rnd.receive_reveals({})
    responses = _reveals(rnd, clients)
    with pytest.raises(AggregationError, match="unmasking began"):
        rnd.receive_shares(0, [])
    rnd.receive_reveals(responses)
    with pytest.raises(AggregationError, match="already received"):
        rnd.receive_reveals(responses)
    assert np.abs(rnd.result().total.ravel() - _inputs(6).sum(0)).max() <= rnd.error_bound()


@pytest.mark.parametrize("defect", ["wrong kind", "not a neighbour"])
def test_a_helper_response_it_cannot_have_given_is_refused(defect):
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6)
    responses = _reveals(rnd, clients)
    helper = 0
    owner = int(rnd.neighbours(helper)[0])
    if defect == "wrong kind":
        responses[helper][owner] = ("s", responses[helper][owner][1])
    else:
        stranger = next(c for c in range(6) if c != helper and c not in rnd.neighbours(helper))
        responses[helper][stranger] = ("b", 1)
    rnd.receive_reveals(responses)
    with pytest.raises(AggregationError, match=f"helper {helper} revealed"):
        rnd.result()


def test_a_client_refuses_malformed_share_and_unmask_requests():
    config = SecAggConfig(server=HBC, neighbours=4)
    seeds = SeedTree(0)
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(6), shape=(1, D), seeds=seeds
    )
    clients = {c: SecAggClient(c, 0, config, seeds) for c in range(6)}
    rnd.receive_keys({c: clients[c].advertise() for c in range(6)})
    request = rnd.share_request(0)
    own_key = clients[0].c.public
    with pytest.raises(AggregationError, match="distinct other client"):
        clients[0].share((0, *request.neighbours[1:]), request.xs, request.c_publics, 3)
    with pytest.raises(AggregationError, match="distinct other client"):
        clients[0].share(
            (*request.neighbours[:3], request.neighbours[0]), request.xs, (own_key,) * 4, 3
        )
    pinned = SecAggClient(0, 0, SecAggConfig(server=HBC, neighbours=4, threshold=4), seeds)
    pinned.advertise()
    with pytest.raises(InsecureParameterError, match="configured threshold is 4"):
        pinned.share(request.neighbours, request.xs, request.c_publics, request.threshold)
    # After those refusals the client still answers the honest request.
    assert len(clients[0].share(request.neighbours, request.xs, request.c_publics, 3)) == 4

    rnd, clients = _stages_until_masked(config, 6)
    requests = rnd.unmask_requests()
    helper, request = next(iter(requests.items()))
    with pytest.raises(AggregationError, match="omit it"):
        clients[helper].reveal(request.inbox, set(request.contributors) - {helper})


def test_a_client_refuses_to_mask_with_a_neighbour_twice():
    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6, missing=(0,))
    request = rnd.mask_request(0)
    neighbours = (*request.neighbours[:3], request.neighbours[0])
    s_publics = (*request.s_publics[:3], request.s_publics[0])
    with pytest.raises(AggregationError, match="twice"):
        clients[0].mask(np.zeros(D), neighbours, s_publics, masking_workspace(D, rnd.config))


def test_a_flower_node_keeps_each_users_stage_between_messages():
    """A SuperNode restores its users from ``Context.state`` for every message: the stage each
    answered is saved with its secrets, so a second mask or unmask message gets nothing."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from securefed.flower import client as node
    from securefed.flower.floors import NodeFloors

    config = SecAggConfig(server=HBC, neighbours=4)
    rnd, clients = _stages_until_masked(config, 6, missing=(4, 5))
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    # The node is one party (securefed.flower): its client is restored for every message.
    setup = node.ClientSetup(None, SeedTree(0), (1, D), floors=NodeFloors(HBC))
    node._save_secrets(context, 0, {4: clients[4]})  # after ShareKeys, as _share does
    _, masked = node._restore_party(setup, context, [4], 0, config)
    _mask_and_upload(rnd, masked, _inputs(6)[4], config)
    node._save_secrets(context, 0, {4: masked})  # after masking, as _mask does
    _, again = node._restore_party(setup, context, [4], 0, config)
    assert again.stage == "mask"
    with pytest.raises(AggregationError, match="once"):
        _mask_and_upload(rnd, again, np.zeros(D), config)
    with pytest.raises(AggregationError, match="one party of round 0"):
        node._restore_party(setup, context, [5], 0, config)  # only for its own party
    # Nor can the server start the round over on the node: fresh clients would answer again.
    with pytest.raises(AggregationError, match="already advertised keys in round 0"):
        node._check_not_advertised(context, 0)
    node._check_not_advertised(context, 1)  # the next round starts afresh
