"""Signed epoch sessions: pair keys kept for an epoch under the default authentication (issue 32).

``SecAggConfig(graph_epoch=E)`` with ``auth="signatures"``: in the first round of an epoch
session each client signs (Ed25519) one advertisement binding the round, the epoch, its
neighbourhood, its round keys and a fresh epoch X25519 key; neighbours agree epoch pair keys
from the epoch keys and every later round of the epoch is authenticated with MACs under them.
The masks and shares stay fresh every round (new ``c``, ``s``, ``b``).

Each attack is the server's code (this test's) driving honest, unmodified clients. Each is run
twice: on this implementation (refused, or nothing decoded) and on a *naive reuse*, this
implementation with one binding taken out by ``monkeypatch`` (the attack then succeeds), so
that every test is shown to fail on the broken code:

* replaying an old epoch's signed advertisement (naive: an epoch key certified once, not bound
  to the round and the epoch);
* relabelling: the graph (a neighbourhood list altered in transit; naive: not signed) and a
  MAC reflected to its own sender (naive: a tag that does not bind sender and recipient);
* mixing epochs: an epoch's keys presented in the next epoch (naive: sessions not keyed by
  the epoch, like a cache of keys for every pair ever met);
* asking twice in one round (naive: no once-per-round ledger, the mask key kept for the epoch);
* lying about dropouts across rounds of an epoch (naive: the mask key ``s`` kept for the epoch
  with per-round derivation; the server that rebuilt it in round t unmasks round t+1).
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import keys as kx
from securefed.crypto import prg, shamir
from securefed.errors import AggregationError, InsecureParameterError
from securefed.transport.secagg import SecAggClient, SecAggConfig, SecAggTransport
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import signatures as sig
from securefed.transport.secagg.client import masking_workspace
from securefed.transport.secagg.signatures import SignatureError, SimulatedSigners

D = 6
N = 10
K = 4
E = 3
VICTIM = 3


def _inputs(n: int = N) -> np.ndarray:
    """Inputs on the fixed-point grid (multiples of 1/64), so a decoded vector is exact."""
    return (np.arange(n)[:, None] + 1 + np.arange(D)[None, :]) / 64 - 0.5


class _Federation:
    """Honest clients whose long-term identities (and so their epoch sessions) persist across
    rounds, and the server's transport (remote clients: this test plays the server)."""

    def __init__(self, graph_epoch: int = E, n: int = N) -> None:
        self.n = n
        self.seeds = SeedTree(0)
        self.config = SecAggConfig(neighbours=K, graph_epoch=graph_epoch).for_round(n)
        self.transport = SecAggTransport(
            self.config, remote_clients=True, keep_payloads=ALL_PAYLOADS, keep_masked=True
        )
        self.keys, self.registry = SimulatedSigners().set_up(range(n), self.seeds)

    def open(self, round_id: int):
        rnd = self.transport.open_round(round_id, range(self.n), shape=(1, D), seeds=self.seeds)
        clients = {
            c: SecAggClient(
                c, round_id, self.config, self.seeds, signer=self.keys[c], registry=self.registry
            )
            for c in range(self.n)
        }
        return rnd, clients

    def advertise(self, rnd, clients) -> None:
        rnd.receive_keys({c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in clients})

    def share(self, rnd, clients) -> None:
        for c, client in clients.items():
            rnd.receive_shares(c, _share(client, rnd.share_request(c)))

    def finish(self, rnd, clients, dropped=()):
        """Mask (all but ``dropped``), ConsistencyCheck, Unmasking; the aggregate."""
        for c, client in clients.items():
            if c in dropped:
                rnd.drop(c)
                continue
            request = rnd.mask_request(c)
            masked, _ = client.mask(
                _inputs(self.n)[c],
                request.neighbours,
                request.s_publics,
                masking_workspace(D, rnd.config),
            )
            rnd.receive_masked(c, masked, weighted=False)
        told = rnd.consistency_requests()
        rnd.receive_consistency({h: clients[h].consistency(u) for h, u in told.items()})
        rnd.receive_reveals(
            {
                h: clients[h].reveal(r.inbox, r.contributors, r.signatures)
                for h, r in rnd.unmask_requests().items()
            }
        )
        return rnd.result()

    def round(self, round_id: int, dropped=()):
        rnd, clients = self.open(round_id)
        self.advertise(rnd, clients)
        self.share(rnd, clients)
        return rnd, clients, self.finish(rnd, clients, dropped)


def _share(client, request):
    return client.share(
        request.neighbours,
        request.xs,
        request.c_publics,
        request.threshold,
        s_publics=request.s_publics,
        signatures=request.signatures,
        n_clients=request.n_clients,
    )


def _decode(rnd, s_private: bytes, round_id: int) -> np.ndarray:
    """What the server makes of the victim's upload in ``rnd`` with its recorded self-mask seed
    and a mask key ``s_private`` it holds (from whichever round)."""
    payload = rnd.view.payload(VICTIM)
    total = payload["masked"].copy()
    expander = prg.MaskExpander(len(total), bits=rnd.config.bits, prg=rnd.config.prg)
    expander.add(total, bytes(payload["revealed_self_seed"]), domain=prg.DOMAIN_SELF_MASK, sign=-1)
    private = kx.keypair_from_seed(s_private).private
    for u in rnd.neighbours(VICTIM).tolist():
        seed = kx.pair_key(
            private, rnd.public_keys[u][1], kx.PURPOSE_PAIR_MASK, round_id, VICTIM, u
        )
        expander.add(total, seed, domain=prg.DOMAIN_PAIR_MASK, sign=-1 if u > VICTIM else 1)
    return rnd.config.fixed_point.decode(total)


# ----------------------------------------------------------------------------- naive reuses
def _naive_certificate(monkeypatch) -> None:
    """Naive: the epoch key certified once, ``Sign(sender, e)``, bound to no round, epoch,
    neighbourhood or round key."""

    def certificate(round_id, epoch, graph_epoch, sender, neighbours, c, s, e, *, registry):
        return kx.PROTOCOL_LABEL + b"epoch-key" + struct.pack(">q", sender) + bytes(e)

    monkeypatch.setattr(sig, "epoch_advertisement_message", certificate)


def _naive_unordered_tags(monkeypatch) -> None:
    """Naive: a round's advertisement tag that binds neither sender nor recipient."""

    def tag_message(round_id, sender, recipient, c_public, s_public, *, registry):
        return kx.PROTOCOL_LABEL + struct.pack(">q", round_id) + bytes(c_public) + bytes(s_public)

    monkeypatch.setattr(sig, "advertisement_tag_message", tag_message)


def _naive_epochless_sessions(monkeypatch) -> None:
    """Naive: sessions not keyed by the epoch (whatever was agreed with a neighbourhood
    serves on, like a cache of keys for every pair ever met)."""
    original = sig.ClientAuthentication.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.epoch = 0

    monkeypatch.setattr(sig.ClientAuthentication, "__init__", init)


def _naive_kept_mask_key(monkeypatch, graph_epoch: int = E) -> None:
    """Naive: the mask key ``s`` kept for the epoch, masks derived per round from it
    (``pair_key`` binds the round), i.e. a reused seed with per-round derivation."""
    original = client_mod._ClientRandomness.keypair

    def keypair(self, name):
        if name != "s":
            return original(self, name)
        _, round_id, client = self._path
        return kx.keypair_from_seed(
            self._seeds.key("secagg", "kept-s", round_id // graph_epoch, client)
        )

    monkeypatch.setattr(client_mod._ClientRandomness, "keypair", keypair)


def _naive_no_round_ledger(monkeypatch) -> None:
    """Naive: a client answers AdvertiseKeys of a round it answered already."""
    original = sig.SigningKey.epoch_session

    def epoch_session(self, epoch, neighbours, round_id, keypair):
        self._epoch_clock["round"] = -1
        return original(self, epoch, neighbours, round_id, keypair)

    monkeypatch.setattr(sig.SigningKey, "epoch_session", epoch_session)


# ----------------------------------------------------------------------------- honest runs
def test_an_epoch_signs_once_and_every_round_sums():
    """Rounds 0-2 share one session per client (one signature, k verifications), round 3
    opens the next epoch's; every round's sum is exact, a dropout within the epoch included."""
    fed = _Federation()
    for r in range(5):
        dropped = (5,) if r == 1 else ()
        _, _, aggregate = fed.round(r, dropped)
        kept = [c for c in range(N) if c not in dropped]
        np.testing.assert_allclose(aggregate.total[0], _inputs()[kept].sum(axis=0), atol=1e-6)
        opened = {key.epoch_sessions_opened for key in fed.keys.values()}
        assert opened == {1 if r < E else 2}
        assert key_setup_pairs(fed) == 0  # no static pairwise key: the default's registry


def key_setup_pairs(fed) -> int:
    return sum(key.setup_pairs for key in fed.keys.values())


def test_the_simulated_transport_opens_one_session_per_epoch_and_cohort():
    transport = SecAggTransport(SecAggConfig(neighbours=K, graph_epoch=E))
    values = _inputs()
    for r in range(4):
        ids = list(range(N)) if r != 2 else list(range(1, N))  # another cohort in round 2
        rnd = transport.open_round(r, ids, shape=(1, D), seeds=SeedTree(1))
        for c in ids:
            rnd.submit(c, values[c])
        np.testing.assert_allclose(rnd.result().total[0], values[ids].sum(axis=0), atol=1e-6)
    # Client 1: epoch 0 with cohort 0-9 (rounds 0, 1), cohort 1-9 (round 2), epoch 1 (round 3).
    assert transport.signers._keys[1].epoch_sessions_opened == 3
    assert "once per epoch session" in transport.public_parameters()["signatures"]


# ----------------------------------------------------------------------------- replay
def _replay_old_epoch(fed):
    """Round 0 (epoch 0) runs; in round 3 (epoch 1) the server relays to the victim its
    neighbour's signed advertisement of round 0 (with the round-0 keys it signed)."""
    old, old_clients = fed.open(0)
    fed.advertise(old, old_clients)
    fed.share(old, old_clients)
    rnd, clients = fed.open(E)
    fed.advertise(rnd, clients)
    request = rnd.share_request(VICTIM)
    w = request.neighbours[0]
    stale = old.advert_signatures[w]
    if w not in old.neighbours(VICTIM).tolist():  # the victim is not in w's old list: add it
        e_public, signature, _ = sig.unpack_epoch_advertisement(w, stale)
        stale = sig.pack_epoch_advertisement(e_public, signature, request.neighbours)
    replayed = dataclasses.replace(
        request,
        c_publics=(old.public_keys[w][0], *request.c_publics[1:]),
        s_publics=(old.public_keys[w][1], *request.s_publics[1:]),
        signatures=(stale, *request.signatures[1:]),
    )
    return _share(clients[VICTIM], replayed)


def test_an_old_epochs_advertisement_replayed_is_refused():
    with pytest.raises(SignatureError, match="signature on its epoch advertisement does not"):
        _replay_old_epoch(_Federation())


def test_an_old_epochs_advertisement_replayed_passes_a_naive_certificate(monkeypatch):
    _naive_certificate(monkeypatch)
    assert len(_replay_old_epoch(_Federation())) == K  # accepted: the victim shared


def test_a_client_does_not_go_back_to_an_ended_epoch():
    fed = _Federation()
    fed.round(E)  # epoch 1
    rnd, clients = fed.open(1)  # epoch 0 again
    with pytest.raises(SignatureError, match="epoch 0, but this client is in epoch 1"):
        clients[VICTIM].advertise(rnd.neighbours(VICTIM).tolist())


# ----------------------------------------------------------------------------- relabelling
def _relabel_graph(fed):
    """The server tells the victim that ``w`` (not its neighbour) is, and relays ``w``'s signed
    epoch advertisement with the victim written into ``w``'s neighbour list."""
    rnd, clients = fed.open(0)
    near = rnd.neighbours(VICTIM).tolist()
    w = next(c for c in range(N) if c != VICTIM and c not in near)
    told = sorted([*near[1:], w])
    adverts = {c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in range(N) if c != VICTIM}
    victim_advert = clients[VICTIM].advertise(told)
    e_public, signature, theirs = sig.unpack_epoch_advertisement(w, adverts[w][2])
    altered = sig.pack_epoch_advertisement(e_public, signature, sorted([*theirs[1:], VICTIM]))
    relayed = {v: adverts[v][2] for v in told if v != w} | {w: altered}
    forged = client_mod.ShareRequest(
        tuple(told),
        tuple(v + 1 for v in told),
        tuple(adverts[v][0] for v in told),
        rnd.threshold,
        s_publics=tuple(adverts[v][1] for v in told),
        signatures=tuple(relayed[v] for v in told),
        n_clients=N,
    )
    assert isinstance(victim_advert[2], bytes)  # the victim signed its (told) neighbourhood
    return _share(clients[VICTIM], forged)


def test_a_relabelled_graph_is_refused():
    """``w``'s signature covers its neighbourhood: the list with the victim written in fails
    (and the list as signed does not name the victim)."""
    with pytest.raises(SignatureError, match="signature on its epoch advertisement"):
        _relabel_graph(_Federation())


def test_a_relabelled_graph_passes_a_naive_certificate(monkeypatch):
    _naive_certificate(monkeypatch)
    assert len(_relabel_graph(_Federation())) == K


def _reflect(fed):
    """Round 1 (MACs): the server relays to the victim its own keys and its own tag addressed
    to ``w`` as ``w``'s advertisement (``K_uv`` is symmetric)."""
    fed.round(0)
    rnd, clients = fed.open(1)
    adverts = {c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in range(N)}
    rnd.receive_keys(adverts)
    request = rnd.share_request(VICTIM)
    w = request.neighbours[0]
    c_own, s_own, tags = adverts[VICTIM]
    reflected = dataclasses.replace(
        request,
        c_publics=(c_own, *request.c_publics[1:]),
        s_publics=(s_own, *request.s_publics[1:]),
        signatures=(tags[w], *request.signatures[1:]),
    )
    return _share(clients[VICTIM], reflected)


def test_a_reflected_tag_is_refused():
    with pytest.raises(SignatureError, match="MAC on its advertisement under the epoch key"):
        _reflect(_Federation())


def test_a_reflected_tag_passes_a_tag_without_sender_and_recipient(monkeypatch):
    _naive_unordered_tags(monkeypatch)
    assert len(_reflect(_Federation())) == K


# ----------------------------------------------------------------------------- mixing epochs
def _impersonate_with_epoch_keys(fed, round_id: int) -> np.ndarray:
    """A thief of the victim's epoch-0 session (its epoch pair keys) plays every neighbour in
    ``round_id``, telling the victim its epoch-0 neighbourhood: its own ``c`` and ``s`` keys,
    tagged under the stolen keys; the victim's decoded input, or the victim's refusal."""
    _, clients0, _ = fed.round(0)
    stolen = clients0[VICTIM].auth.session  # the thief's only secret
    near = list(stolen.neighbours)
    rnd, clients = fed.open(round_id)
    victim = clients[VICTIM]
    c_victim, s_victim, _ = victim.advertise(near)
    fakes = {v: kx.keypair_from_seed(bytes([v + 7]) * 32) for v in near}
    digest = fed.registry.digest
    tags = tuple(
        stolen.keys[v][0].tag(
            sig.advertisement_tag_message(
                round_id, v, VICTIM, fakes[v].public, fakes[v].public, registry=digest
            )
        )
        for v in near
    )
    xs = tuple(v + 1 for v in near)
    sealed = victim.share(
        near,
        xs,
        tuple(fakes[v].public for v in near),
        rnd.threshold,
        s_publics=tuple(fakes[v].public for v in near),
        signatures=tags,
        n_clients=N,
    )
    masked, _ = victim.mask(
        _inputs()[VICTIM], near, [fakes[v].public for v in near], masking_workspace(D, fed.config)
    )
    points = {"b": [], "s": []}
    for v, x, blob in zip(near, xs, sealed, strict=True):
        key = kx.pair_key(fakes[v].private, c_victim, kx.PURPOSE_SHARE_KEY, round_id, VICTIM, v)
        plain = kx.open_sealed(fed.config.aead, key, blob, kx.share_aad(round_id, VICTIM, v))
        points["b"].append((x, shamir.decode_share(plain[: shamir.SHARE_BYTES])))
        points["s"].append((x, shamir.decode_share(plain[shamir.SHARE_BYTES :])))
    t = rnd.threshold
    b = shamir.int_to_secret(shamir.reconstruct(points["b"][:t], t))
    s_private = kx.keypair_from_seed(
        shamir.int_to_secret(shamir.reconstruct(points["s"][:t], t))
    ).private
    total = masked.copy()
    expander = prg.MaskExpander(len(total), bits=fed.config.bits, prg=fed.config.prg)
    expander.add(total, b, domain=prg.DOMAIN_SELF_MASK, sign=-1)
    for v in near:
        seed = kx.pair_key(s_private, fakes[v].public, kx.PURPOSE_PAIR_MASK, round_id, VICTIM, v)
        expander.add(total, seed, domain=prg.DOMAIN_PAIR_MASK, sign=-1 if v > VICTIM else 1)
    assert s_victim is not None
    return fed.config.fixed_point.decode(total)


def test_an_epochs_keys_are_refused_in_the_next_epoch():
    """Round E begins epoch 1: the victim opens a new session and wants signed epoch
    advertisements; tags under the epoch-0 keys are refused, whatever graph it is told."""
    with pytest.raises(SignatureError, match="no signed epoch advertisement"):
        _impersonate_with_epoch_keys(_Federation(), E)


def test_an_epochs_keys_decode_the_victim_in_the_next_epoch_without_the_epoch(monkeypatch):
    _naive_epochless_sessions(monkeypatch)
    decoded = _impersonate_with_epoch_keys(_Federation(), E)
    np.testing.assert_allclose(decoded, _inputs()[VICTIM], atol=1e-9)


def test_a_thief_of_the_epoch_state_impersonates_within_the_epoch_the_documented_weakness():
    """The trade-off stated in SECURITY.md: the epoch pair keys are symmetric, so whoever
    steals a client's epoch state tags as any neighbour to it until the epoch ends (the
    default, Ed25519 every round, resists this: a stolen key signs only as its owner)."""
    decoded = _impersonate_with_epoch_keys(_Federation(), 1)
    np.testing.assert_allclose(decoded, _inputs()[VICTIM], atol=1e-9)


# ----------------------------------------------------------------------------- asking twice
def _ask_twice(fed):
    """Round 1 run twice: in the first the victim is said to have dropped (the server rebuilds
    its mask key), in the second it contributes (the server rebuilds its self-mask seed)."""
    fed.round(0)
    first, _, _ = fed.round(1, dropped=(VICTIM,))
    second, _, _ = fed.round(1)
    return _decode(second, bytes(first.view.payload(VICTIM)["revealed_mask_key"]), 1)


def test_asking_twice_in_one_round_gets_nothing():
    with pytest.raises(AggregationError, match="advertised in round 1 already"):
        _ask_twice(_Federation())


def test_asking_twice_decodes_the_victim_without_the_ledger_and_with_a_kept_mask_key(
    monkeypatch,
):
    _naive_no_round_ledger(monkeypatch)
    _naive_kept_mask_key(monkeypatch)
    np.testing.assert_allclose(_ask_twice(_Federation()), _inputs()[VICTIM], atol=1e-9)


# ----------------------------------------------------------------------------- dropout lies
def _dropout_lie_across_rounds(fed) -> np.ndarray:
    """Round 1: the server says the victim dropped after ShareKeys (a lie or not) and rebuilds
    its mask key from its neighbours' shares; round 2 (same epoch, same graph, same pair
    keys): the victim contributes, and the server applies round 1's mask key to its upload."""
    fed.round(0)
    lied, _, _ = fed.round(1, dropped=(VICTIM,))
    rebuilt = bytes(lied.view.payload(VICTIM)["revealed_mask_key"])
    honest, _, _ = fed.round(2)
    assert honest.neighbours(VICTIM).tolist() == lied.neighbours(VICTIM).tolist()
    return _decode(honest, rebuilt, 2)


def test_a_mask_key_rebuilt_in_round_t_opens_nothing_in_round_t_plus_1():
    decoded = _dropout_lie_across_rounds(_Federation())
    assert not np.allclose(decoded, _inputs()[VICTIM], atol=1e-3)


def test_a_mask_key_kept_for_the_epoch_opens_the_next_round(monkeypatch):
    _naive_kept_mask_key(monkeypatch)
    decoded = _dropout_lie_across_rounds(_Federation())
    np.testing.assert_allclose(decoded, _inputs()[VICTIM], atol=1e-9)


# ----------------------------------------------------------------------------- refusals
def test_an_epoch_session_refuses_a_contributor_count():
    with pytest.raises(InsecureParameterError, match="a MAC convinces only its recipient"):
        SecAggConfig(graph_epoch=2, min_contributors=3)
    rnd = SecAggTransport(SecAggConfig(neighbours=K, graph_epoch=2)).open_round(
        0, range(N), shape=(1, D), seeds=SeedTree(0)
    )
    with pytest.raises(InsecureParameterError, match="graph_epoch=1"):
        rnd.require_contributors(5)


def test_the_signed_epoch_is_not_carried_on_flower():
    from securefed.flower import describe_transport

    with pytest.raises(NotImplementedError, match="does not carry graph_epoch=2"):
        describe_transport(SecAggTransport(SecAggConfig(graph_epoch=2), remote_clients=True))


def test_a_session_wants_the_neighbourhood_it_was_told():
    """A neighbour swapped in between AdvertiseKeys and ShareKeys is refused."""
    fed = _Federation()
    rnd, clients = fed.open(0)
    fed.advertise(rnd, clients)
    request = rnd.share_request(VICTIM)
    w = next(c for c in range(N) if c != VICTIM and c not in request.neighbours)
    swapped = dataclasses.replace(
        request,
        neighbours=(*request.neighbours[:-1], w),
        c_publics=(*request.c_publics[:-1], rnd.public_keys[w][0]),
        s_publics=(*request.s_publics[:-1], rnd.public_keys[w][1]),
        signatures=(*request.signatures[:-1], rnd.advert_signatures[w]),
    )
    with pytest.raises(SignatureError, match=f"client {w} is not in the neighbourhood"):
        _share(clients[VICTIM], swapped)


def test_a_client_that_missed_its_sessions_first_share_gets_a_new_graph():
    """Liveness: the victim advertises in the session's first round and drops before ShareKeys
    while its neighbours complete theirs (they hold keys with it, it holds none). The cohort's
    next round is refused before any share (a session opened beside one continued) and the
    round after draws a new graph, so new sessions, and sums."""
    fed = _Federation()
    rnd, clients = fed.open(0)
    fed.advertise(rnd, clients)
    for c, client in clients.items():
        if c != VICTIM:
            rnd.receive_shares(c, _share(client, rnd.share_request(c)))
    graph = {c: rnd.neighbours(c).tolist() for c in range(N)}
    broken, clients = fed.open(1)
    with pytest.raises(AggregationError, match="draws a new graph"):
        fed.advertise(broken, clients)
    rnd, clients = fed.open(2)
    assert rnd.view.public["secagg_graph_redrawn"] == 1
    assert {c: rnd.neighbours(c).tolist() for c in range(N)} != graph
    fed.advertise(rnd, clients)
    fed.share(rnd, clients)
    aggregate = fed.finish(rnd, clients)
    np.testing.assert_allclose(aggregate.total[0], _inputs().sum(axis=0), atol=1e-6)
