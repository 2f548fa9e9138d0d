"""Secure aggregation against a lying server (issue 21, part 1; Bonawitz et al. 2017, Sec. 6).

The attack first: a server that relays its own keys in place of ``2t - k`` of the victim's
neighbours (there is no PKI, so an honest-but-curious client cannot tell) and, once it holds the
victim's masked input, tells some helpers that the victim dropped (their ``s``-shares) and the
others that it contributed (their ``b``-shares). Against the honest-but-curious variant it decodes
the victim's vector exactly. Against the malicious-server variant the substituted keys fail their
signatures, the lie fails ConsistencyCheck, and the server never holds ``t`` shares of both of
the victim's secrets. Then each signature or consistency failure, one by one, stops the round.
Every test of the malicious variant runs with both of its authentications (``auth="macs"``,
the default, and ``auth="signatures"``), and the MAC-specific forgeries (a tag under a key of the
server's, a tag reflected to its sender or addressed to another client, a tag on another
survivor set) stop the round too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import keys as kx
from securefed.crypto import prg, shamir
from securefed.errors import AggregationError, InsecureParameterError
from securefed.transport.registry import build_transport
from securefed.transport.secagg import SecAggClient, SecAggConfig, SecAggTransport
from securefed.transport.secagg.client import masking_workspace
from securefed.transport.secagg.signatures import (
    ConsistencyError,
    KeyRegistry,
    SignatureError,
    SigningKey,
    SimulatedSigners,
    advertisement_message,
    advertisement_tag_message,
    consistency_tag_message,
)

D = 6
HBC = "honest_but_curious"
VICTIM = 3
# (n, neighbours): the complete graph of Bonawitz et al. (k = 6, t = 4) and a sparse SecAgg+
# graph (k = 4, t = 3); in both the server needs 2t - k = 2 substituted neighbours.
GRAPHS = [(7, 100), (10, 4)]
AUTHS = ["macs", "signatures"]
SIGNED = "(signature|MAC)"  # how a refusal names the authenticator, in either mode


@pytest.fixture(params=AUTHS)
def auth(request) -> str:
    return request.param


def _to(authenticator, recipient: int):
    """What the server relays of an authenticator to ``recipient``: the signature, or the MAC
    addressed to it (``None`` when there is none)."""
    if isinstance(authenticator, dict):
        return authenticator.get(recipient)
    return authenticator


def _advertise(rnd, clients, ids=None) -> dict:
    """AdvertiseKeys of ``clients`` (each told its neighbours, which MACs are addressed to)."""
    ids = range(len(clients)) if ids is None else ids
    return {c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in ids}


def _inputs(n: int) -> np.ndarray:
    """Inputs on the fixed-point grid (multiples of 1/64), so a decoded vector is exact."""
    return (np.arange(n)[:, None] + 1 + np.arange(D)[None, :]) / 64 - 0.5


def _open(config: SecAggConfig, n: int, round_id: int = 0, *, signers=None, seeds=None):
    """The server's round (remote clients) and the clients, set up with their signing keys."""
    seeds = SeedTree(0) if seeds is None else seeds
    config = config.for_round(n)
    transport = SecAggTransport(
        config, remote_clients=True, keep_payloads=ALL_PAYLOADS, keep_masked=True
    )
    rnd = transport.open_round(round_id, range(n), shape=(1, D), seeds=seeds)
    if config.malicious:
        signers = SimulatedSigners() if signers is None else signers
        keys, registry = signers.set_up(range(n), seeds)
        clients = {
            c: SecAggClient(c, round_id, config, seeds, signer=keys[c], registry=registry)
            for c in range(n)
        }
    else:
        clients = {c: SecAggClient(c, round_id, config, seeds) for c in range(n)}
    return rnd, clients


def _share(rnd, client, request):
    sealed = client.share(
        request.neighbours,
        request.xs,
        request.c_publics,
        request.threshold,
        s_publics=request.s_publics,
        signatures=request.signatures,
    )
    rnd.receive_shares(client.id, sealed)


def _mask(rnd, client, values):
    request = rnd.mask_request(client.id)
    masked, _ = client.mask(
        values, request.neighbours, request.s_publics, masking_workspace(D, rnd.config)
    )
    rnd.receive_masked(client.id, masked, weighted=False)


def _honest_until_masked(config, n, round_id=0, *, signers=None, seeds=None):
    rnd, clients = _open(config, n, round_id, signers=signers, seeds=seeds)
    rnd.receive_keys(_advertise(rnd, clients))
    for c in range(n):
        _share(rnd, clients[c], rnd.share_request(c))
    for c in range(n):
        _mask(rnd, clients[c], _inputs(n)[c])
    return rnd, clients


def _x(rnd, client: int) -> int:
    return int(rnd.view.positions([client])[0]) + 1


def _decode_victim(rnd, b_points, s_points) -> np.ndarray:
    """What a server holding ``t`` shares of ``b_v`` and of ``s_v`` makes of ``y_v``."""
    b = shamir.int_to_secret(shamir.reconstruct(b_points, rnd.threshold))
    s_private = shamir.int_to_secret(shamir.reconstruct(s_points, rnd.threshold))
    total = rnd.view.payload(VICTIM)["masked"].copy()
    expander = prg.MaskExpander(len(total), bits=rnd.config.bits, prg=rnd.config.prg)
    expander.add(total, b, domain=prg.DOMAIN_SELF_MASK, sign=-1)
    private = kx.keypair_from_seed(s_private).private
    for u in rnd.neighbours(VICTIM).tolist():
        seed = kx.pair_key(private, rnd.public_keys[u][1], kx.PURPOSE_PAIR_MASK, 0, VICTIM, u)
        expander.add(total, seed, domain=prg.DOMAIN_PAIR_MASK, sign=-1 if u > VICTIM else 1)
    return rnd.config.fixed_point.decode(total)


def _substituted(rnd, request, fakes):
    """The victim's ShareRequest with the server's own ``c`` keys in place of ``fakes``' keys."""
    c_publics = tuple(
        fakes[v].public if v in fakes else key
        for v, key in zip(request.neighbours, request.c_publics, strict=True)
    )
    return dataclasses.replace(request, c_publics=c_publics)


def _lying_server_attack(config, n):
    """The whole attack; returns ``(decoded victim vector or None, refusals by client)``."""
    rnd, clients = _open(config, n)
    rnd.receive_keys(_advertise(rnd, clients))
    neighbours = rnd.neighbours(VICTIM).tolist()
    m = 2 * rnd.threshold - rnd.neighbours_k  # neighbours whose keys the server replaces
    fakes = {v: kx.keypair_from_seed(bytes([v + 1]) * 32) for v in neighbours[:m]}
    refusals: dict[int, Exception] = {}
    for c in range(n):
        request = rnd.share_request(c)
        try:
            _share(rnd, clients[c], _substituted(rnd, request, fakes) if c == VICTIM else request)
        except AggregationError as error:
            refusals[c] = error
    for c in range(n):
        if c in rnd.shared_clients and all(v in rnd.shared_clients for v in rnd.neighbours(c)):
            _mask(rnd, clients[c], _inputs(n)[c])
    if VICTIM not in rnd.submitted:
        return None, refusals, rnd
    # The server opens the shares the victim sealed to the server's own keys: both kinds.
    points = {"b": [], "s": []}
    for v, fake in fakes.items():
        key = kx.pair_key(
            fake.private, rnd.public_keys[VICTIM][0], kx.PURPOSE_SHARE_KEY, 0, VICTIM, v
        )
        plain = kx.open_sealed(
            rnd.config.aead, key, rnd.share_store[(VICTIM, v)], kx.share_aad(0, VICTIM, v)
        )
        points["b"].append((_x(rnd, v), shamir.decode_share(plain[: shamir.SHARE_BYTES])))
        points["s"].append((_x(rnd, v), shamir.decode_share(plain[shamir.SHARE_BYTES :])))
    honest = [v for v in neighbours if v not in fakes]
    told_dropped = set(honest[: len(honest) // 2])
    requests = rnd.unmask_requests()
    for helper in honest:
        contributors = set(requests[helper].contributors)
        if helper in told_dropped:
            contributors.discard(VICTIM)  # the lie: "the victim dropped"
        kind, value = clients[helper].reveal(requests[helper].inbox, contributors)[VICTIM]
        points[kind].append((_x(rnd, helper), value))
    return _decode_victim(rnd, points["b"], points["s"]), refusals, rnd


# ----------------------------------------------------------------------------- the lying server
@pytest.mark.parametrize(("n", "neighbours"), GRAPHS)
def test_a_lying_server_decodes_the_victim_against_the_honest_but_curious_variant(n, neighbours):
    decoded, refusals, rnd = _lying_server_attack(
        SecAggConfig(server=HBC, neighbours=neighbours), n
    )
    assert not refusals
    assert rnd.neighbours_k == min(neighbours, n - 1)
    np.testing.assert_array_equal(decoded, _inputs(n)[VICTIM])


@pytest.mark.parametrize(("n", "neighbours"), GRAPHS)
def test_the_same_lie_against_the_malicious_variant_is_refused_and_learns_nothing(
    n, neighbours, auth
):
    """The substituted keys fail their signatures: the victim refuses ShareKeys, masks nothing."""
    decoded, refusals, rnd = _lying_server_attack(SecAggConfig(neighbours=neighbours, auth=auth), n)
    assert decoded is None and VICTIM not in rnd.submitted
    assert isinstance(refusals[VICTIM], SignatureError)
    assert "does not verify" in str(refusals[VICTIM])
    assert (VICTIM, rnd.neighbours(VICTIM)[0]) not in rnd.share_store  # nothing sealed, even


def _consistency_lie(rnd, clients, told_dropped, *, forward_all=False):
    """ConsistencyCheck with the lie: ``told_dropped`` are told the victim dropped.

    The server forwards each helper the signatures of its neighbours that signed the set it was
    told (its best move: any other signature fails to verify), or every one (``forward_all``).
    Returns the victim's revealed shares by kind and each helper's refusal.
    """
    truth = next(iter(rnd.consistency_requests().values()))
    lie = truth - {VICTIM}
    told = {h: lie if h in told_dropped else truth for h in truth}
    signed = {h: clients[h].consistency(told[h]) for h in truth}
    points, refusals = {"b": [], "s": []}, {}
    for helper in truth:
        near = rnd.neighbours(helper).tolist()
        signatures = {
            v: _to(signed[v], helper)
            for v in near
            if v in signed
            and (forward_all or told[v] == told[helper])
            and _to(signed[v], helper) is not None  # a MAC exists only to neighbours in the set
        }
        inbox = {u: rnd.share_store[(u, helper)] for u in near}
        try:
            revealed = clients[helper].reveal(inbox, set(told[helper]), signatures)
        except AggregationError as error:
            refusals[helper] = error
            continue
        if VICTIM in revealed:
            kind, value = revealed[VICTIM]
            points[kind].append((_x(rnd, helper), value))
    return points, refusals


@pytest.mark.parametrize(("n", "neighbours"), GRAPHS)
def test_a_lie_about_who_dropped_never_yields_both_secrets_of_the_victim(n, neighbours, auth):
    """Whichever of the victim's neighbours the server tells "the victim dropped", it never
    holds ``t`` shares of both its self-mask seed and its mask key: nothing of ``y_v`` opens."""
    config = SecAggConfig(neighbours=neighbours, auth=auth)
    k = min(neighbours, n - 1)
    # Every split of a sparse neighbourhood; in the complete graph, one split of each size.
    splits = range(2**k) if k <= 4 else [(1 << j) - 1 for j in range(k + 1)]
    for split in splits:
        rnd, clients = _honest_until_masked(config, n)
        near = rnd.neighbours(VICTIM).tolist()
        told_dropped = {v for bit, v in enumerate(near) if split >> bit & 1}
        points, refusals = _consistency_lie(rnd, clients, told_dropped)
        assert min(len(points["b"]), len(points["s"])) < rnd.threshold
        short = "b" if len(points["b"]) < rnd.threshold else "s"
        with pytest.raises(ValueError, match="more are needed"):
            shamir.reconstruct(points[short], rnd.threshold)
        # Every helper shown a split view of its neighbourhood refused, naming ConsistencyCheck.
        assert all(isinstance(e, ConsistencyError | SignatureError) for e in refusals.values())
        if told_dropped and len(told_dropped) < len(near):
            assert refusals


def test_in_the_complete_graph_every_honest_client_refuses_the_balanced_lie(auth):
    """Bonawitz et al.'s complete graph, the split the server would need (half and half):
    no helper holds ``t`` consistent signatures, so every one refuses and nothing is revealed."""
    config = SecAggConfig(neighbours=100, auth=auth)  # n = 7: k = 6, t = 4
    rnd, clients = _honest_until_masked(config, 7)
    near = rnd.neighbours(VICTIM).tolist()
    points, refusals = _consistency_lie(rnd, clients, set(near[:3]))
    assert set(refusals) == set(range(7))
    assert all(isinstance(e, ConsistencyError) for e in refusals.values())
    assert all("fewer than the threshold" in str(e) for e in refusals.values())
    assert points == {"b": [], "s": []}
    # Forwarding every signature instead: each helper finds one on another set and refuses.
    rnd, clients = _honest_until_masked(config, 7)
    points, refusals = _consistency_lie(rnd, clients, set(near[:3]), forward_all=True)
    assert set(refusals) == set(range(7)) and points == {"b": [], "s": []}
    assert all(isinstance(e, SignatureError | ConsistencyError) for e in refusals.values())


# ----------------------------------------------------------------------------- each failure
def test_a_forged_advertisement_stops_the_round(auth):
    config = SecAggConfig(neighbours=4, auth=auth)
    rnd, clients = _open(config, 6)
    adverts = _advertise(rnd, clients)
    rnd.receive_keys(adverts)
    request = rnd.share_request(0)
    v = request.neighbours[0]
    # The server relays its own c key for a neighbour (keeping the neighbour's signature) ...
    swapped = dataclasses.replace(
        request,
        c_publics=(kx.keypair_from_seed(bytes(32)).public, *request.c_publics[1:]),
    )
    with pytest.raises(SignatureError, match=f"client {v}'s {SIGNED} on its advertisement"):
        _share(rnd, clients[0], swapped)
    # ... or authenticates the substitute with a key of its own: not the registered one either
    # (a signature under its own signing key; a MAC under a key it chose, lacking K_0v).
    server_key = SigningKey.from_seed(bytes(range(32)))
    fake = kx.keypair_from_seed(bytes(32)).public
    digest = clients[0].registry.digest  # public: the server binds the registry's digest too
    if auth == "signatures":
        forged = server_key.sign(
            advertisement_message(0, v, fake, request.s_publics[0], registry=digest)
        )
    else:
        forged = kx.mac(
            bytes(range(32)),
            advertisement_tag_message(0, v, 0, fake, request.s_publics[0], registry=digest),
        )
    resigned = dataclasses.replace(
        request,
        c_publics=(fake, *request.c_publics[1:]),
        signatures=(forged, *request.signatures[1:]),
    )
    with pytest.raises(SignatureError, match="does not verify"):
        _share(rnd, clients[0], resigned)
    # ... or strips the signatures.
    with pytest.raises(SignatureError, match="signed advertisements"):
        _share(rnd, clients[0], dataclasses.replace(request, signatures=()))
    # The refusals changed nothing: the honest request still goes through.
    _share(rnd, clients[0], request)
    assert 0 in rnd.shared_clients


def test_an_s_key_other_than_the_signed_one_is_refused_at_masking(auth):
    config = SecAggConfig(neighbours=4, auth=auth)
    rnd, clients = _open(config, 6)
    rnd.receive_keys(_advertise(rnd, clients))
    for c in range(6):
        _share(rnd, clients[c], rnd.share_request(c))
    request = rnd.mask_request(0)
    swapped = (kx.keypair_from_seed(bytes(32)).public, *request.s_publics[1:])
    with pytest.raises(SignatureError, match="other than the one"):
        clients[0].mask(
            _inputs(6)[0], request.neighbours, swapped, masking_workspace(D, rnd.config)
        )


def test_a_client_outside_the_key_registry_is_refused(auth):
    """A Sybil: the server adds a client of its own; nobody registered its key at set-up."""
    config = SecAggConfig(neighbours=100, auth=auth).for_round(5)
    seeds = SeedTree(0)
    keys, registry = SimulatedSigners().set_up(range(4), seeds)  # client 4 is the server's
    sybil = SigningKey.from_seed(bytes(range(1, 33)))
    rogue = KeyRegistry(
        {**registry.keys, 4: sybil.public}, {**registry.statics, 4: sybil.static_public}
    )
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(5), shape=(1, D), seeds=seeds
    )
    clients = {
        c: SecAggClient(c, 0, config, seeds, signer=keys[c], registry=registry) for c in range(4)
    }
    sybil.pin_registry(rogue.digest)  # the Sybil's own "enrolment"
    clients[4] = SecAggClient(4, 0, config, seeds, signer=sybil, registry=rogue)
    # With signatures client 0 refuses at ShareKeys; with MACs already at AdvertiseKeys (it
    # has no static key of client 4's to address a tag to).
    with pytest.raises(SignatureError, match="client 4 is not in the key registry"):
        rnd.receive_keys(_advertise(rnd, clients))
        _share(rnd, clients[0], rnd.share_request(0))


def test_a_server_with_the_registry_refuses_a_forged_advertisement_early():
    """Signatures only: a MAC is checked by its recipient, never by the server."""
    config = SecAggConfig(neighbours=4, auth="signatures").for_round(6)
    seeds = SeedTree(0)
    keys, registry = SimulatedSigners().set_up(range(6), seeds)
    rnd = SecAggTransport(config, remote_clients=True, registry=registry).open_round(
        0, range(6), shape=(1, D), seeds=seeds
    )
    clients = {
        c: SecAggClient(c, 0, config, seeds, signer=keys[c], registry=registry) for c in range(6)
    }
    adverts = _advertise(rnd, clients)
    _, s_key, signature = adverts[2]
    adverts[2] = (kx.keypair_from_seed(bytes(32)).public, s_key, signature)
    with pytest.raises(SignatureError, match="client 2's signature"):
        rnd.receive_keys(adverts)


def test_mismatched_survivor_sets_stop_the_round(auth):
    config = SecAggConfig(neighbours=4, auth=auth)
    rnd, clients = _honest_until_masked(config, 6)
    survivors = next(iter(rnd.consistency_requests().values()))
    signed = {h: clients[h].consistency(survivors) for h in survivors}
    helper = 0
    near = rnd.neighbours(helper).tolist()
    inbox = {u: rnd.share_store[(u, helper)] for u in near}
    # Asked to unmask another set than the one it signed:
    with pytest.raises(ConsistencyError, match="another one"):
        clients[helper].reveal(
            inbox, set(survivors) - {near[0]}, {v: _to(signed[v], helper) for v in near}
        )
    # A neighbour's signature on another set (the server told it another U3):
    other = _honest_until_masked(config, 6)
    told_other = set(survivors) - {5}
    rnd2, clients2 = other
    rnd2.consistency_requests()
    signed2 = {h: clients2[h].consistency(survivors if h else told_other) for h in survivors}
    near2 = rnd2.neighbours(1).tolist()
    sigs = {v: _to(signed2[v], 1) for v in near2}
    inbox2 = {u: rnd2.share_store[(u, 1)] for u in near2}
    if 0 in sigs:
        with pytest.raises(SignatureError, match=f"client 0's {SIGNED} on its survivor set"):
            clients2[1].reveal(inbox2, set(survivors), sigs)
    else:  # 0 is not 1's neighbour here: forward it anyway, from outside the neighbourhood
        sigs[0] = _to(signed2[0], next(iter(signed2[0]))) if auth == "macs" else signed2[0]
        with pytest.raises(ConsistencyError, match="not among its neighbours"):
            clients2[1].reveal(inbox2, set(survivors), sigs)


def test_too_few_signatures_stop_the_round(auth):
    config = SecAggConfig(neighbours=4, auth=auth)  # k = 4, t = 3
    rnd, clients = _honest_until_masked(config, 6)
    survivors = next(iter(rnd.consistency_requests().values()))
    signed = {h: clients[h].consistency(survivors) for h in survivors}
    near = rnd.neighbours(0).tolist()
    inbox = {u: rnd.share_store[(u, 0)] for u in near}
    few = {v: _to(signed[v], 0) for v in near[: rnd.threshold - 1]}
    with pytest.raises(ConsistencyError, match="fewer than the threshold 3"):
        clients[0].reveal(inbox, set(survivors), few)
    # A refused request changes nothing: with t signatures on the set it signed, it unmasks.
    revealed = clients[0].reveal(inbox, set(survivors), {v: _to(signed[v], 0) for v in near})
    assert {kind for kind, _ in revealed.values()} == {"b"}


def test_a_signature_replayed_from_another_round_stops_the_round(auth):
    config = SecAggConfig(neighbours=4, auth=auth)
    signers = SimulatedSigners()
    seeds = SeedTree(0)
    old, old_clients = _honest_until_masked(config, 6, 0, signers=signers, seeds=seeds)
    survivors = next(iter(old.consistency_requests().values()))
    old_signed = {h: old_clients[h].consistency(survivors) for h in survivors}
    old_adverts = {c: old.advert_signatures[c] for c in range(6)}
    rnd, clients = _honest_until_masked(config, 6, 1, signers=signers, seeds=seeds)
    rnd.consistency_requests()
    signed = {h: clients[h].consistency(survivors) for h in survivors}
    near = rnd.neighbours(0).tolist()
    replayed = {v: _to(signed[v], 0) for v in near}
    replayed[near[0]] = _to(old_signed[near[0]], 0) or next(iter(old_signed[near[0]].values()))
    inbox = {u: rnd.share_store[(u, 0)] for u in near}
    with pytest.raises(SignatureError, match=f"client {near[0]}'s {SIGNED} on its survivor set"):
        clients[0].reveal(inbox, set(survivors), replayed)
    # An advertisement signature from round 0 does not sign round 1's keys.
    fresh, fresh_clients = _open(config, 6, 2, signers=signers, seeds=seeds)
    fresh.receive_keys(_advertise(fresh, fresh_clients))
    request = fresh.share_request(0)
    stale = dataclasses.replace(
        request,
        signatures=tuple(_to(old_adverts[v], 0) or bytes(32) for v in request.neighbours),
    )
    with pytest.raises(SignatureError, match="does not verify"):
        _share(fresh, fresh_clients[0], stale)


def test_a_client_signs_one_survivor_set_and_unmasks_only_after_consistency_check(auth):
    config = SecAggConfig(neighbours=4, auth=auth)
    rnd, clients = _honest_until_masked(config, 6)
    survivors = next(iter(rnd.consistency_requests().values()))
    with pytest.raises(AggregationError, match="ConsistencyCheck before Unmasking"):
        clients[1].reveal({}, set(survivors), {})
    clients[0].consistency(survivors)
    with pytest.raises(AggregationError, match="already answered ConsistencyCheck"):
        clients[0].consistency(survivors - {5})
    with pytest.raises(AggregationError, match="only after ConsistencyCheck"):
        rnd.unmask_requests()


# ----------------------------------------------------------------------------- the default round
@pytest.mark.parametrize("drop_after", [(), (4,)])
def test_the_malicious_variant_gives_the_honest_but_curious_sum_bit_for_bit(drop_after, auth):
    values = np.random.default_rng(0).uniform(-1, 1, size=(12, D))
    totals, views = {}, {}
    for server in ("malicious", HBC):
        config = SecAggConfig(
            neighbours=6, server=server, auth=auth if server != HBC else "signatures"
        )
        transport = SecAggTransport(config)
        rnd = transport.open_round(0, range(12), shape=(1, D), seeds=SeedTree(1))
        rnd.drop(11)  # dropped before submitting
        for c in range(11):
            rnd.submit(c, values[c])
        for c in drop_after:  # dropped after submitting, before ConsistencyCheck
            rnd.drop(c)
        totals[server] = rnd.result().total
        views[server] = rnd.view
    np.testing.assert_array_equal(totals["malicious"], totals[HBC])
    np.testing.assert_array_equal(
        views["malicious"].aggregate["ring_sum"], views[HBC].aggregate["ring_sum"]
    )
    assert views["malicious"].public["secagg_server"] == "malicious"


def test_the_threat_model_is_an_option_malicious_by_default_and_validated():
    assert SecAggConfig().server == "malicious"
    with pytest.raises(ValueError, match="server must be one of"):
        SecAggConfig(server="trusted")
    transport = build_transport("secagg", n_clients=10)
    assert transport.config.server == "malicious"
    assert "malicious server" in transport.public_parameters()["protocol"]
    assert transport.config.auth == "signatures"  # KCI-resistant (issue 30 item 2)
    assert build_transport("secagg:auth=macs", n_clients=10).config.auth == "macs"
    with pytest.raises(ValueError, match="auth must be one of"):
        SecAggConfig(auth="none")
    with pytest.raises(ValueError, match="applies only to server='malicious'"):
        SecAggConfig(server=HBC, auth="macs")
    weak = build_transport("secagg:server=honest_but_curious", n_clients=10)
    assert weak.public_parameters()["server"] == HBC
    assert weak.public_parameters()["signatures"] == "none"
    seeds = SeedTree(0)
    with pytest.raises(InsecureParameterError, match="signing key and the key registry"):
        SecAggClient(0, 0, SecAggConfig(), seeds)
    keys, registry = SimulatedSigners().set_up([0], seeds)
    with pytest.raises(ValueError, match="apply only to server='malicious'"):
        SecAggClient(0, 0, SecAggConfig(server=HBC), seeds, signer=keys[0], registry=registry)
    with pytest.raises(ValueError, match="not the one the key registry holds"):
        SecAggClient(1, 0, SecAggConfig(), seeds, signer=keys[0], registry=registry)
    with pytest.raises(AggregationError, match="no ConsistencyCheck"):
        hbc = SecAggTransport(SecAggConfig(server=HBC, neighbours=4))
        hbc.open_round(0, range(6), shape=(1, D), seeds=seeds).consistency_requests()


# ----------------------------------------------------------------------------- Flower's SecAgg+
def test_the_same_lie_decodes_the_victim_against_flowers_secaggplus():
    """Flower 1.42's node reveals the share of the self-mask seed of every node it is told is
    active and of the mask key of every node it is told is dead, in one answer, with nothing
    signed: a server that lists the victim in both decodes it from one message per neighbour,
    at a minority or a majority threshold; splitting the neighbours works at a minority one.
    (benchmarks/results/secagg_malicious/flower_lie.json records the same runs.)"""
    pytest.importorskip("flwr")
    from securefed.bench.secagg_flower_lie import run_flower_lie

    for lie, threshold in [("both lists", 3), ("split", 3), ("both lists", 4)]:
        record = run_flower_lie(lie, threshold=threshold, length=200)
        assert record["node_refusals"] == {}
        assert record["decoded"] is True
        assert record["max_abs_error"] <= record["quantization_step"]
    # At a majority threshold the split cannot give t shares of both: Flower's answer-once
    # holds there, and only the unchecked double listing breaks it.
    split = run_flower_lie("split", threshold=4, length=200)
    assert split["decoded"] is False


def test_the_audit_warns_of_a_round_run_against_an_honest_but_curious_server_only():
    from securefed.audit import audit

    codes = {}
    for server in ("malicious", HBC):
        transport = SecAggTransport(SecAggConfig(neighbours=4, server=server))
        rnd = transport.open_round(0, range(6), shape=(1, D), seeds=SeedTree.secure_mode())
        for c in range(6):
            rnd.submit(c, np.full(D, 0.25))
        rnd.result()
        codes[server] = audit(transport.view).codes
    assert "secagg-honest-but-curious" in codes[HBC]
    assert "secagg-honest-but-curious" not in codes["malicious"]


# ----------------------------------------------------------------------------- MAC forgeries
def _mac_round():
    config = SecAggConfig(neighbours=4, auth="macs")
    rnd, clients = _open(config, 6)
    adverts = _advertise(rnd, clients)
    rnd.receive_keys(adverts)
    return rnd, clients, adverts


def test_a_mac_reflected_to_its_sender_or_addressed_to_another_client_stops_the_round():
    """u's own tag to v handed back to u as v's, and v's tag to another neighbour w handed to u,
    are refused (here the advertised keys differ too; the ConsistencyCheck test below is where
    the sender and recipient inside the tag alone stop the reflection: both directions MAC the
    same set under the same symmetric K_uv)."""
    rnd, clients, adverts = _mac_round()
    request = rnd.share_request(0)
    v = request.neighbours[0]
    own = adverts[0][2][v]  # client 0's own tag, addressed to v, under K_0v
    key = clients[0].signer.pairwise_key(0, v, clients[0].registry.statics[v])[0][0]
    # The attack's premise: the reflected tag is a valid MAC under the very key 0 checks with.
    digest = clients[0].registry.digest
    assert key.check(advertisement_tag_message(0, 0, v, *rnd.public_keys[0], registry=digest), own)
    reflected = dataclasses.replace(request, signatures=(own, *request.signatures[1:]))
    with pytest.raises(SignatureError, match=f"client {v}'s MAC on its advertisement"):
        _share(rnd, clients[0], reflected)
    other = next(w for w in adverts[v][2] if w != 0)  # v's tag to another of its neighbours
    misrouted = dataclasses.replace(
        request, signatures=(adverts[v][2][other], *request.signatures[1:])
    )
    with pytest.raises(SignatureError, match="addressed to another client"):
        _share(rnd, clients[0], misrouted)
    _share(rnd, clients[0], request)  # the refusals changed nothing
    assert 0 in rnd.shared_clients


def test_a_consistency_mac_reflected_or_on_another_set_stops_the_round():
    """K_uv is symmetric and u's and v's tags are on the same survivor set: without the sender
    and recipient inside the tag, the server could hand u its own tag as v's (checked: this test
    fails when the tag message leaves them out)."""
    config = SecAggConfig(neighbours=4, auth="macs")
    rnd, clients = _honest_until_masked(config, 6)
    survivors = next(iter(rnd.consistency_requests().values()))
    tags = {h: clients[h].consistency(survivors) for h in survivors}
    near = rnd.neighbours(0).tolist()
    inbox = {u: rnd.share_store[(u, 0)] for u in near}
    honest = {v: tags[v][0] for v in near}
    # Client 0's own tag to near[0], reflected back as near[0]'s tag to 0:
    reflected = {**honest, near[0]: tags[0][near[0]]}
    with pytest.raises(SignatureError, match=f"client {near[0]}'s MAC on its survivor set"):
        clients[0].reveal(inbox, set(survivors), reflected)
    # A tag the server computes itself on the set, under a key it chose (it lacks K_0v):
    forged = {
        **honest,
        near[0]: kx.mac(
            bytes(32),
            consistency_tag_message(0, near[0], 0, survivors, registry=clients[0].registry.digest),
        ),
    }
    with pytest.raises(SignatureError, match="MAC on its survivor set does not verify"):
        clients[0].reveal(inbox, set(survivors), forged)
    revealed = clients[0].reveal(inbox, set(survivors), honest)
    assert {kind for kind, _ in revealed.values()} == {"b"}


def test_static_pairwise_keys_are_agreed_once_per_pair_and_rounds_stay_apart():
    """The set-up cost is paid once per pair: a second round over the same clients agrees no new
    static key, yet its tags differ from the first round's (the round is inside every tag)."""
    transport = SecAggTransport(SecAggConfig(neighbours=100, auth="macs"))
    tags = {}
    for round_id in (0, 1):
        rnd = transport.open_round(round_id, range(5), shape=(1, D), seeds=SeedTree(0))
        identities = transport._signers._keys
        if round_id == 0:
            assert {c: identities[c].setup_pairs for c in range(5)} == dict.fromkeys(range(5), 4)
            assert rnd.timings["setup"] > 0
        else:
            assert all(identities[c].setup_pairs == 4 for c in range(5))
        tags[round_id] = rnd.advert_signatures[0]
        for c in range(5):
            rnd.submit(c, np.full(D, 0.25))
        np.testing.assert_allclose(rnd.result().total, np.full((1, D), 1.25))
    assert all(tags[0][v] != tags[1][v] for v in tags[0])


def test_the_cost_benchmark_measures_the_three_variants_side_by_side():
    """``securefed bench secagg-malicious`` at a toy size: every variant ran, counted its
    operations, and the MAC round's set-up (its static pairwise keys) is reported apart."""
    from securefed.bench.bench_secagg import malicious_table, run_malicious_cost

    costs = dict.fromkeys(
        ("mask_expansion", "rounding_draw", "x25519", "x25519_keygen", "hmac"), 1e-5
    )
    costs.update(ed25519_sign=4e-5, ed25519_verify=1e-4, keystream_bytes_per_second=1e9)
    costs.update(hkdf=2e-6, aead_seal=3e-6, aead_open=3e-6)
    costs["cpu"] = dict(costs)
    report = run_malicious_cost((10,), 200, (0.1,), repeats=1, costs=costs, count_contributors=True)
    (row,) = report["rows"]
    for key in ("honest_but_curious", "malicious_macs", "malicious_signatures"):
        assert row[key]["status"] == "ok" and row[key]["floor_seconds"] > 0
        # issue 32's floor adds HKDF, Shamir and the sealed shares to the same counts
        ops = row[key]["operations"]
        assert ops["hkdf"] == ops["x25519"] and ops["aead_seal"] == 10 * row[key]["k"]
        assert row[key]["cpu_floor_full_seconds"] > row[key]["cpu_floor_seconds"]
    macs, signed = row["malicious_macs"], row["malicious_signatures"]
    assert macs["operations"]["hmac"] > 0 and macs["operations"]["ed25519_verify"] == 0
    assert signed["operations"]["ed25519_verify"] > 0 and signed["operations"]["hmac"] == 0
    assert macs["operations"]["static_x25519"] == 10 * macs["k"]
    assert macs["setup_seconds"] > 0
    assert macs["first_round_seconds"] == pytest.approx(macs["seconds"] + macs["setup_seconds"])
    assert row["malicious_macs_over_hbc"] > 0
    # The counted round: each of its helpers verifies as many endorsements as there are
    # endorsers (issue 30 item 1), more than the t of the signed round.
    counted = row["malicious_counted"]
    assert counted["status"] == "ok"
    assert counted["operations"]["ed25519_verify"] > signed["operations"]["ed25519_verify"]
    table = malicious_table(report)
    assert "MACs (opt-in, not KCI-resistant)" in table and "signatures (default)" in table
    assert "helpers count the contributors" in table
