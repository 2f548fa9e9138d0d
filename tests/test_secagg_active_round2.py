"""Secure aggregation against active adversaries, round two (issue 30, items 1-4).

Each exploit is the server's code (this test's) driving honest, unmodified clients
(:class:`~securefed.transport.secagg.SecAggClient` and the distributed-DP noise recipe):

1. the server thins distributed-DP noise: it states 20 clients (each adds the noise share
   planned for 20) and unmasks a sum of 3;
2. key-compromise impersonation: a server holding only the victim's long-term key tags every
   neighbour's advertisement to the victim under MACs (refused under signatures, the default);
3. a forged key registry (the server's keys under real neighbours' ids) handed to the victim;
4. the server proposes ``k = 1, t = 1``; the colluder sizing of ``k`` and ``t`` is checked
   against an independent exact computation of its bound.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import keys as kx
from securefed.crypto import prg, shamir
from securefed.errors import AggregationError, InsecureParameterError
from securefed.privacy.ledger import PrivacyLedger
from securefed.transport.dp import DPTransport, client_noise_std
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
)

D = 6
VICTIM = 3


def _inputs(n: int) -> np.ndarray:
    """Inputs on the fixed-point grid (multiples of 1/64), so a decoded vector is exact."""
    return (np.arange(n)[:, None] + 1 + np.arange(D)[None, :]) / 64 - 0.5


def _open(config, n, *, seeds=None, registry_for=None, length=D):
    """The server's round (remote clients) and honest clients enrolled by an honest authority.

    ``registry_for(client, registry)`` is the registry the server hands ``client`` (default:
    the authentic one).
    """
    seeds = SeedTree(0) if seeds is None else seeds
    config = config.for_round(n)
    transport = SecAggTransport(config, remote_clients=True, keep_payloads=ALL_PAYLOADS)
    rnd = transport.open_round(0, range(n), shape=(1, length), seeds=seeds)
    keys, registry = SimulatedSigners().set_up(range(n), seeds)
    handed = {c: registry if registry_for is None else registry_for(c, registry) for c in range(n)}
    clients = {
        c: SecAggClient(c, 0, config, seeds, signer=keys[c], registry=handed[c]) for c in range(n)
    }
    return rnd, clients, keys, registry


def _open_sealed_shares(rnd, victim_c, sealed, fakes, xs, threshold):
    """The victim's ``b`` and ``s`` secrets, from the shares it sealed to the server's keys."""
    points = {"b": [], "s": []}
    for (v, x), blob in zip(xs, sealed, strict=True):
        key = kx.pair_key(fakes[v].private, victim_c, kx.PURPOSE_SHARE_KEY, 0, VICTIM, v)
        plain = kx.open_sealed(rnd.config.aead, key, blob, kx.share_aad(0, VICTIM, v))
        points["b"].append((x, shamir.decode_share(plain[: shamir.SHARE_BYTES])))
        points["s"].append((x, shamir.decode_share(plain[shamir.SHARE_BYTES :])))
    b = shamir.int_to_secret(shamir.reconstruct(points["b"][:threshold], threshold))
    s_private = shamir.int_to_secret(shamir.reconstruct(points["s"][:threshold], threshold))
    return b, s_private


def _share(client, request):
    """ShareKeys of an honest ``client`` on the server's ``request`` (as sent: maybe a lie)."""
    return client.share(
        request.neighbours,
        request.xs,
        request.c_publics,
        request.threshold,
        s_publics=request.s_publics,
        signatures=request.signatures,
        n_clients=request.n_clients,
    )


def _impersonate_neighbours(rnd, clients, forge):
    """The server relays its own ``c`` keys for every neighbour of the victim, each with an
    authenticator made by ``forge(v, c_fake, s_v)``; returns the decoded victim vector.

    Raises whatever the victim raises when it refuses.
    """
    n = len(clients)
    rnd.receive_keys({c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in range(n)})
    request = rnd.share_request(VICTIM)
    fakes = {v: kx.keypair_from_seed(bytes([v + 7]) * 32) for v in request.neighbours}
    c_publics = tuple(fakes[v].public for v in request.neighbours)
    signatures = tuple(
        forge(v, fakes[v].public, s)
        for v, s in zip(request.neighbours, request.s_publics, strict=True)
    )
    forged = dataclasses.replace(request, c_publics=c_publics, signatures=signatures)
    victim = clients[VICTIM]
    sealed = _share(victim, forged)
    masked, _ = victim.mask(
        _inputs(n)[VICTIM],
        forged.neighbours,
        forged.s_publics,
        masking_workspace(D, rnd.config),
    )
    b, s_private = _open_sealed_shares(
        rnd,
        rnd.public_keys[VICTIM][0],
        sealed,
        fakes,
        list(zip(forged.neighbours, forged.xs, strict=True)),
        forged.threshold,
    )
    total = masked.copy()
    expander = prg.MaskExpander(len(total), bits=rnd.config.bits, prg=rnd.config.prg)
    expander.add(total, b, domain=prg.DOMAIN_SELF_MASK, sign=-1)
    private = kx.keypair_from_seed(s_private).private
    for v, s_public in zip(forged.neighbours, forged.s_publics, strict=True):
        seed = kx.pair_key(private, s_public, kx.PURPOSE_PAIR_MASK, 0, VICTIM, v)
        expander.add(total, seed, domain=prg.DOMAIN_PAIR_MASK, sign=-1 if v > VICTIM else 1)
    return rnd.config.fixed_point.decode(total)


# ----------------------------------------------------------------------------- item 2: KCI
def _kci_forge(stolen: SigningKey, registry: KeyRegistry, auth: str):
    """What a holder of the victim's own long-term key makes of neighbour ``v``'s advertisement
    authenticator: under MACs the very tag ``v`` would send (``K_{v,victim}`` is the victim's
    too); under signatures only a signature under the victim's key, which is not ``v``'s."""

    def forge(v, c_fake, s_public):
        if auth == "macs":
            key = stolen.pairwise_key(VICTIM, v, registry.statics[v])[0][0]
            message = advertisement_tag_message(
                0, v, VICTIM, c_fake, s_public, registry=registry.digest
            )
            return key.tag(message)
        return stolen.sign(advertisement_message(0, v, c_fake, s_public, registry=registry.digest))

    return forge


def _kci_attack(config):
    rnd, clients, keys, registry = _open(config, 10)
    stolen = keys[VICTIM]  # the only secret the server holds: the victim's long-term identity
    return _impersonate_neighbours(rnd, clients, _kci_forge(stolen, registry, config.auth))


def test_kci_under_macs_decodes_the_victim_the_documented_weakness():
    """MAC mode's documented weakness (docs/secagg.md, SECURITY.md): whoever holds the victim's
    own long-term key tags every neighbour's advertisement to it and decodes its vector."""
    decoded = _kci_attack(SecAggConfig(neighbours=4, auth="macs"))
    np.testing.assert_array_equal(decoded, _inputs(10)[VICTIM])


def test_kci_is_refused_under_the_default_authentication():
    """The default (Ed25519 signatures) resists KCI: the victim's own key signs nothing of a
    neighbour's, so the victim refuses the substituted keys and seals nothing to them."""
    assert SecAggConfig().auth == "signatures"
    with pytest.raises(SignatureError, match="does not verify"):
        _kci_attack(SecAggConfig(neighbours=4))


# ----------------------------------------------------------------------------- item 3: registry
def _server_identity(v: int) -> SigningKey:
    return SigningKey.from_seed(bytes([200 + v]) * 32)


def _forged_registry(client, registry):
    """What the server hands the victim: the authentic registry with its own keys under the ids
    of the victim's would-be neighbours (every other client; the victim's own key stays)."""
    if client != VICTIM:
        return registry
    keys, statics = dict(registry.keys), dict(registry.statics)
    for v in keys:
        if v != VICTIM:
            keys[v] = _server_identity(v).public
            statics[v] = _server_identity(v).static_public
    return KeyRegistry(keys, statics)


def _registry_forge(auth: str, victim_static: bytes, digest: bytes):
    def forge(v, c_fake, s_public):
        server = _server_identity(v)
        if auth == "macs":
            key = server.pairwise_key(v, VICTIM, victim_static)[0][0]
            message = advertisement_tag_message(0, v, VICTIM, c_fake, s_public, registry=digest)
            return key.tag(message)
        return server.sign(advertisement_message(0, v, c_fake, s_public, registry=digest))

    return forge


@pytest.mark.parametrize("auth", ["macs", "signatures"])
def test_a_forged_registry_handed_by_the_server_is_refused(auth):
    """No corrupt client: the server hands the victim a registry with its own keys under real
    neighbours' ids. The victim pinned the enrolment authority's digest of the registry, so the
    forged one is refused before anything is sealed."""
    config = SecAggConfig(neighbours=4, auth=auth)
    with pytest.raises((SignatureError, InsecureParameterError, ValueError), match="registry"):
        rnd, clients, keys, registry = _open(config, 10, registry_for=_forged_registry)
        # (Bound to the authentic registry's digest, which is public: the victim binds its pin.)
        forge = _registry_forge(auth, keys[VICTIM].static_public, registry.digest)
        _impersonate_neighbours(rnd, clients, forge)


@pytest.mark.parametrize("auth", ["macs", "signatures"])
def test_a_split_registry_is_detected_by_the_digest_every_message_binds(auth):
    """Whoever hands out registries gives client 0 another one (the authentic keys plus a Sybil
    of the server's) and pins its digest: each client's key registry is then self-consistent,
    but every advertisement and survivor set binds the registry digest its sender pinned, so
    client 0 and its neighbours refuse each other's messages."""
    seeds = SeedTree(0)
    config = SecAggConfig(neighbours=4, auth=auth).for_round(10)
    keys, registry = SimulatedSigners().set_up(range(10), seeds)
    sybil = _server_identity(50)
    split = KeyRegistry(
        {**registry.keys, 99: sybil.public}, {**registry.statics, 99: sybil.static_public}
    )
    keys[0].pin_registry(split.digest)
    handed = {c: split if c == 0 else registry for c in range(10)}
    transport = SecAggTransport(config, remote_clients=True)
    rnd = transport.open_round(0, range(10), shape=(1, D), seeds=seeds)
    clients = {
        c: SecAggClient(c, 0, config, seeds, signer=keys[c], registry=handed[c]) for c in range(10)
    }
    rnd.receive_keys({c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in range(10)})
    refused = set()
    for c in [0, *rnd.neighbours(0).tolist()]:
        request = rnd.share_request(c)
        with pytest.raises(SignatureError, match="does not verify"):
            _share(clients[c], request)
        refused.add(c)
    assert 0 in refused and len(refused) == 1 + rnd.neighbours_k


def test_a_registry_without_a_pinned_digest_is_refused():
    """A long-term identity that pinned no registry digest at enrolment cannot tell an
    authentic registry from a forged one: the client refuses to take part."""
    seeds = SeedTree(0)
    _, registry = SimulatedSigners().set_up(range(4), seeds)
    bare = SigningKey.from_seed(bytes(range(32)))
    unpinned = KeyRegistry(
        {**registry.keys, 0: bare.public}, {**registry.statics, 0: bare.static_public}
    )
    with pytest.raises(SignatureError, match="no key-registry digest pinned"):
        SecAggClient(0, 0, SecAggConfig(), seeds, signer=bare, registry=unpinned)


# ----------------------------------------------------------------------------- item 4: k and t
def test_a_client_refuses_k_1_t_1_from_the_server():
    """A round of 100: the server asks a client for a 1-out-of-1 sharing with one neighbour (its
    share would be the secret itself). The client holds its own floor and refuses, naming it."""
    rnd, clients, _, _ = _open(SecAggConfig(), 100)
    rnd.receive_keys({c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in range(100)})
    request = rnd.share_request(0)
    lowered = dataclasses.replace(
        request,
        neighbours=request.neighbours[:1],
        xs=request.xs[:1],
        c_publics=request.c_publics[:1],
        s_publics=request.s_publics[:1],
        signatures=request.signatures[:1],
        threshold=1,
    )
    with pytest.raises(InsecureParameterError, match=r"neighbours|threshold"):
        _share(clients[0], lowered)
    assert clients[0].stage == "advertise"  # the refusal changed nothing


def _exact_union_bound(n: int, corrupt: int, k: int, t: int) -> Fraction:
    """``(n - c) P(X >= 2t - k)``, ``X ~ Hypergeometric(n - 1, c, k)``, in exact rationals
    (the number of corrupt clients among an honest client's ``k`` random neighbours)."""
    need = 2 * t - k
    total = math.comb(n - 1, k)
    tail = sum(
        math.comb(corrupt, x) * math.comb(n - 1 - corrupt, k - x)
        for x in range(max(need, 0), min(k, corrupt) + 1)
    )
    return Fraction((n - corrupt) * tail, total)


@pytest.mark.parametrize("n", [100, 1000, 10000])
@pytest.mark.parametrize("colluders", [None, 0.1, 3])
def test_colluder_sizing_meets_its_bound_by_an_independent_computation(n, colluders):
    """``k`` and ``t`` sized for the colluders keep the union bound on "some honest client has
    ``2t - k`` or more corrupt neighbours" below ``2^-security_bits`` (Bell et al. 2020), checked
    here in exact rational arithmetic; one less in ``t`` would not (the sizing is tight)."""
    config = SecAggConfig() if colluders is None else SecAggConfig(colluders=colluders)
    k, t = config.round_parameters(n)
    corrupt = config.corrupt_clients(n)
    expected = (
        math.floor(0.05 * n)
        if colluders is None
        else (math.floor(colluders * n) if colluders < 1 else colluders)
    )
    assert corrupt == expected
    target = Fraction(1, 2**config.security_bits)
    assert _exact_union_bound(n, corrupt, k, t) <= target
    if t - 1 > k / 2:
        assert _exact_union_bound(n, corrupt, k, t - 1) > target
    # Every client holds the same floor: it accepts these parameters and refuses one less in t
    # (naming the threshold) or a single neighbour (naming the neighbours).
    config.check_parameters(n, k, t)
    if t - 1 > k / 2 and corrupt:
        with pytest.raises(InsecureParameterError, match=r"threshold t=.* below the floor"):
            config.check_parameters(n, k, t - 1)
    with pytest.raises(InsecureParameterError, match="neighbour"):
        config.check_parameters(n, 1, 1)


# ----------------------------------------------------------------------------- item 1: DP noise
SIGMA, DP_CLIP, STATED, REAL = 1.0, 1.0, 20, 3
NOISE_LENGTH = 4000


def _noisy_values(client: int, std: float) -> np.ndarray:
    rng = np.random.default_rng(100 + client)
    return rng.normal(0.0, std, NOISE_LENGTH)


def _three_of_twenty():
    """A round the server runs among 3 clients (a complete graph, ``k = 2``, ``t = 2``: every
    check on the neighbourhood passes), of 20 enrolled, each told the round has 20 clients and
    holding that minimum (the count its noise share is calibrated for), masked with its noise."""
    std = client_noise_std("distributed", DP_CLIP, SIGMA, STATED)
    config = SecAggConfig(clip=8.0, neighbours=2, colluders=0)
    seeds = SeedTree(0)
    transport = SecAggTransport(config, remote_clients=True)
    rnd = transport.open_round(0, range(REAL), shape=(1, NOISE_LENGTH), seeds=seeds)
    keys, registry = SimulatedSigners().set_up(range(STATED), seeds)
    client_config = dataclasses.replace(rnd.config, min_contributors=STATED)
    clients = {
        c: SecAggClient(c, 0, client_config, seeds, signer=keys[c], registry=registry)
        for c in range(REAL)
    }
    rnd.receive_keys({c: clients[c].advertise(rnd.neighbours(c).tolist()) for c in range(REAL)})
    for c in range(REAL):
        request = rnd.share_request(c)
        rnd.receive_shares(c, _share(clients[c], request))
    workspace = masking_workspace(NOISE_LENGTH, rnd.config)
    for c in range(REAL):
        request = rnd.mask_request(c)
        masked, _ = clients[c].mask(
            _noisy_values(c, std), request.neighbours, request.s_publics, workspace
        )
        rnd.receive_masked(c, masked, weighted=False)
    return rnd, clients


def test_a_server_that_states_20_clients_cannot_unmask_a_sum_of_3():
    """The server tells each client the round has 20 clients: each adds the noise share planned
    for 20 (std ``sigma C / sqrt(20)``), then the server runs the round among 3 of them. Were
    the sum of 3 unmasked, its noise std would be ``sqrt(3/20) sigma C = 0.39`` instead of
    ``sigma C`` (0.384 measured on the code before the fix, every client check passing). Each
    client's floor is the count its noise was calibrated for: it endorses no smaller survivor
    set, and reveals nothing unless that many clients endorsed it, so nothing is unmasked."""
    rnd, clients = _three_of_twenty()
    requests = rnd.consistency_requests()
    endorsed, refusals = {}, {}
    for v, survivors in requests.items():
        try:
            endorsed[v] = clients[v].consistency(survivors)
        except AggregationError as error:
            refusals[v] = error
    if endorsed:
        rnd.receive_consistency(endorsed)
        revealed = {}
        for v, request in rnd.unmask_requests().items():
            try:
                revealed[v] = clients[v].reveal(
                    request.inbox, request.contributors, request.signatures
                )
            except AggregationError as error:
                refusals[v] = error
        if revealed:
            rnd.receive_reveals(revealed)
            noise = rnd.result().total.ravel()
            # The std of 4000 Gaussian draws is within 5% of its value w.p. > 1 - 1e-9.
            assert np.std(noise) >= 0.95 * SIGMA * DP_CLIP, f"noise std {np.std(noise):.3f}"
    assert set(refusals) == set(range(REAL))
    assert all("minimum of 20 contributors" in str(e) for e in refusals.values())


def test_a_survivor_set_padded_with_absent_clients_does_not_pass_the_count():
    """The server pads the survivor set with 17 enrolled clients that never took part (so its
    size reaches the minimum and the clients endorse it): the helpers count the endorsements
    themselves, find 3 valid ones of 20, and reveal nothing."""
    rnd, clients = _three_of_twenty()
    padded = frozenset(range(STATED))
    endorsements = {v: clients[v].consistency(padded) for v in range(REAL)}
    for v in range(REAL):
        near = rnd.neighbours(v).tolist()
        inbox = {u: rnd.share_store[(u, v)] for u in near}
        with pytest.raises(ConsistencyError, match=r"3 valid endorsement.*minimum of 20"):
            clients[v].reveal(inbox, set(padded), endorsements)
        assert clients[v].stage == "consistency"  # nothing revealed


def test_an_honest_round_of_the_stated_size_unmasks_with_the_full_noise():
    """The same clients and floor in an honest round of 20: every client endorses, every helper
    verifies 20 endorsements, and the sum carries noise of std ``sigma C``."""
    ledger = PrivacyLedger(budget=(50.0, 1e-5))
    inner = SecAggTransport(SecAggConfig(clip=8.0, neighbours=6))
    dp = DPTransport(
        inner, clip=DP_CLIP, noise_multiplier=SIGMA, placement="distributed", ledger=ledger
    )
    zeros = np.zeros((STATED, NOISE_LENGTH))
    rnd = dp.open_round(0, range(STATED), shape=(1, NOISE_LENGTH), seeds=SeedTree(3))
    assert rnd.inner.config.min_contributors == STATED  # held by every client of the round
    for c in range(STATED):
        rnd.submit(c, zeros[c])
    total = rnd.result().total
    # 4000 draws: the std is within 5% w.p. > 1 - 1e-9.
    assert np.std(total) == pytest.approx(SIGMA * DP_CLIP, rel=0.05)
    assert ledger.history[-1][0] == pytest.approx(SIGMA)


def test_the_dp_minimum_sizes_each_share_and_the_servers_charge():
    """With ``min_contributors=10`` of 20 asked, each client adds ``sigma C / sqrt(10)``: a sum
    of any 10 endorsers carries ``sigma C``, which is what the ledger charges against the
    server; the released sum of all 20 carries ``sqrt(2) sigma C``, charged against the
    released model. A round that loses 11 clients is refused by the clients themselves."""
    ledger = PrivacyLedger(budget=(50.0, 1e-5))
    inner = SecAggTransport(SecAggConfig(clip=8.0, neighbours=8, expected_dropout=0.0))
    dp = DPTransport(
        inner,
        clip=DP_CLIP,
        noise_multiplier=SIGMA,
        placement="distributed",
        ledger=ledger,
        min_contributors=10,
        delta=1e-5,
    )
    zeros = np.zeros((STATED, NOISE_LENGTH))
    rnd = dp.open_round(0, range(STATED), shape=(1, NOISE_LENGTH), seeds=SeedTree(4))
    for c in range(STATED):
        rnd.submit(c, zeros[c])
    total = rnd.result().total
    assert np.std(total) == pytest.approx(math.sqrt(2) * SIGMA * DP_CLIP, rel=0.05)
    released = ledger.history[-1][0]
    assert released == pytest.approx(math.sqrt(2) * SIGMA)
    server = ledger.server_history[-1][0]
    assert server == pytest.approx(SIGMA)
    rnd = dp.open_round(1, range(STATED), shape=(1, NOISE_LENGTH), seeds=SeedTree(5))
    for c in range(9):
        rnd.submit(c, zeros[c])
    for c in range(9, STATED):
        rnd.drop(c)
    with pytest.raises(AggregationError, match="minimum"):
        rnd.result()


def test_a_contributor_count_is_refused_under_macs():
    """A MAC convinces only its recipient: a client cannot count contributors beyond its
    neighbours, so a minimum of contributors (and distributed DP over MAC-authenticated secure
    aggregation) is refused, naming signatures."""
    with pytest.raises(InsecureParameterError, match="auth='signatures'"):
        SecAggConfig(auth="macs", min_contributors=5)
    inner = SecAggTransport(SecAggConfig(clip=8.0, neighbours=4, auth="macs"))
    dp = DPTransport(inner, clip=1.0, noise_multiplier=1.0, placement="distributed")
    with pytest.raises(InsecureParameterError, match="auth='signatures'"):
        dp.open_round(0, range(6), shape=(1, 4), seeds=SeedTree(0))


def test_shared_checks_remember_only_what_verified():
    """The simulation's shortcut (clients sharing one registry object verify each distinct
    signature once) gives the same answers: a remembered signature passes only for its own
    client and message, a forged one still fails, and the digest does not depend on it."""
    keys, registry = SimulatedSigners().set_up(range(3), SeedTree(0))
    assert registry.shared_checks
    plain = KeyRegistry(dict(registry.keys), dict(registry.statics))
    assert plain.digest == registry.digest and not plain.shared_checks
    message = b"survivor set"
    signature = keys[0].sign(message)
    for reg in (registry, plain):
        reg.verify(0, message, signature, what="survivor set")
        reg.verify(0, message, signature, what="survivor set")  # remembered (shared) or again
        with pytest.raises(SignatureError, match="does not verify"):
            reg.verify(1, message, signature, what="survivor set")  # another client's key
        with pytest.raises(SignatureError, match="does not verify"):
            reg.verify(0, b"another set", signature, what="survivor set")
        forged = bytes(64)
        with pytest.raises(SignatureError, match="does not verify"):
            reg.verify(0, message, forged, what="survivor set")
